"""The linter and the type checker are part of the test command: `ruff check` on the code, the
tests and the benchmarks, and `mypy` on the library (both configured in pyproject.toml)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _tool(name: str) -> list[str]:
    """The tool next to this interpreter (the venv's), else on PATH, run as a module otherwise."""
    local = Path(sys.executable).parent / name
    if local.exists():
        return [str(local)]
    found = shutil.which(name)
    return [found] if found else [sys.executable, "-m", name]


def _run(argv: list[str], timeout: float) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError as e:  # not installed: the test extra is missing
        pytest.fail(f"{argv[0]} is not installed (pip install -e '.[test]'): {e}")


def test_ruff_is_clean():
    r = _run([*_tool("ruff"), "check", "--no-cache", "src", "tests", "benchmarks", "models"], timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.slow
@pytest.mark.timeout(1200)  # a cold mypy over src/ takes minutes on 2 cores
def test_mypy_is_clean():
    # incremental (.mypy_cache): a rerun takes seconds, a first run a minute or two
    r = _run([*_tool("mypy"), "src"], timeout=900)
    assert r.returncode == 0, r.stdout + r.stderr


# paths of the development machine and of the team's notes beside the repository, built from parts
# so that this file, which looks for them, does not contain them itself
OUTSIDE_MARKERS = ("/" + "work" + "/", ".." + "/shared/", "shared" + "/notes")


def test_no_file_points_outside_the_repository():
    """The project stands on its own: code, docs and comments name no path outside the tree."""
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    bad = []
    for rel in files:
        path = ROOT / rel
        if path.suffix not in {".py", ".md", ".toml", ".txt", ".sh", ".cfg", ".json", ".j2"}:
            continue
        text = path.read_text(errors="replace")
        for marker in OUTSIDE_MARKERS:
            if marker in text:
                bad.append(f"{rel}: {marker}")
    assert not bad, "paths outside the repository:\n" + "\n".join(bad)
