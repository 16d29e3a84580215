"""`posttrain init-domain NAME` writes a plugin package that installs, registers through its entry
point, passes `posttrain tasks check` and its own generated test, as generated."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from posttrain.cli import app

SRC = Path(__file__).resolve().parents[1] / "src"


def _env(*paths: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), *map(str, paths)])}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_generated_package_installs_and_passes_its_checks(tmp_path):
    pytest.importorskip("setuptools", reason="the package is built with setuptools")
    target = tmp_path / "pkg"
    result = CliRunner().invoke(app, ["init-domain", "mytasks", "--dir", str(target)])
    assert result.exit_code == 0, result.output
    assert (target / "posttrain_mytasks" / "domains.py").is_file()

    # a real install (wheel built from the generated pyproject) into a private directory, so the
    # entry point comes from the generated metadata and the shared environment stays untouched
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--no-index", "--target", str(site), str(target)], check=True, timeout=240)
    [entry_points] = site.glob("posttrain_mytasks-*.dist-info/entry_points.txt")
    assert "mytasks = posttrain_mytasks.domains:domains" in entry_points.read_text()

    check = subprocess.run([sys.executable, "-m", "posttrain.cli", "tasks", "check", "--family", "mytasks",
                            "--json", "-n", "6"], env=_env(site), capture_output=True, text=True, timeout=120)
    assert check.returncode == 0, check.stdout + check.stderr
    summary = json.loads(check.stdout.splitlines()[-1])
    assert summary["domains"] == 2 and summary["tasks"] == 12
    assert summary["oracle_pass_rate"] == 1.0 and summary["hack_pass_rate"] == 0.0

    tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                            str(target / "tests")], env=_env(site), capture_output=True, text=True,
                           timeout=120, cwd=tmp_path)
    assert tests.returncode == 0, tests.stdout + tests.stderr
    assert "8 passed" in tests.stdout


@pytest.mark.parametrize("name, message", [
    ("My-Tasks", "lowercase letters"), ("1tasks", "starting with a letter"), ("class", "reserved"),
    ("data", "reserved"), ("math", "already installed"),
])
def test_a_bad_name_is_one_line_and_writes_nothing(tmp_path, name, message):
    target = tmp_path / "pkg"
    result = CliRunner().invoke(app, ["init-domain", name, "--dir", str(target)])
    assert result.exit_code == 2
    assert message in result.output and "Traceback" not in result.output
    assert not target.exists()


def test_a_non_empty_target_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    result = CliRunner().invoke(app, ["init-domain", "mytasks", "--dir", str(tmp_path)])
    assert result.exit_code == 2 and "not empty" in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert CliRunner().invoke(app, ["init-domain", "mytasks", "--dir", str(empty)]).exit_code == 0
