"""Harbor conformance, a task folder's own `tests/` and `solution/` arrive exactly: a binary
fixture byte for byte, an executable helper with its exec bit, a symlink, an empty directory;
UTF-8 files keep the path rewriting, binary ones are never touched. (The workspace's files:
`tests/test_harbor_files.py`; files inside a built image: `tests/test_harbor_images.py`.)"""

from __future__ import annotations

import gzip
import hashlib
import os
from pathlib import Path

import pytest

from posttrain.sandbox.bwrap import bwrap_problem
from posttrain.tasks.families.terminal.harbor import HarborTaskError, load_harbor_task
from posttrain.values.task import FileEntry

PAYLOAD = "the expected answer\n"
FIXTURE = gzip.compress(PAYLOAD.encode(), mtime=0)  # starts 1f 8b: not UTF-8
PNG_LIKE = b"\x89PNG\r\n\x1a\n" + bytes(range(256))  # not UTF-8 either, has a "/tests" in no form

TEST_SH = f"""#!/bin/bash
cd /tests
ok=1
echo "{hashlib.sha256(FIXTURE).hexdigest()}  fixture.gz" | sha256sum -c --quiet || ok=0
echo "{hashlib.sha256(PNG_LIKE).hexdigest()}  data/pixel.png" | sha256sum -c --quiet || ok=0
[ "$(stat -c %a check)" = 755 ] && [ "$(stat -c %a data)" = 711 ] || ok=0
[ "$(readlink expected.gz)" = fixture.gz ] && [ -d empty ] && [ -z "$(ls -A empty)" ] || ok=0
./check || ok=0   # runs only with its exec bit
# Harbor's root reads a 0600 file and enters a 0700 directory; the test uid may too (group bits)
[ "$(cat secret.txt)" = sealed ] && [ "$(cat private/inner.txt)" = inner ] || ok=0
[ "$(stat -c %a secret.txt)" = 640 ] && [ "$(stat -c %a private)" = 750 ] || ok=0
echo $ok > /logs/verifier/reward.txt
"""
CHECK = """#!/bin/sh
# compares the agent's answer with the fixture (through the symlink, /tests rewritten)
[ "$(zcat /tests/expected.gz)" = "$(cat /app/out.txt)" ]
"""
UNPACK = "#!/bin/sh\nzcat /solution/payload.gz > /app/out.txt\n"


def _folder(tmp_path: Path) -> Path:
    root = tmp_path / "binary-fixtures"
    for rel, data in {"instruction.md": "Put the answer in /app/out.txt.\n",
                      "task.toml": "[metadata]\nsplit = 'train'\n[verifier]\ntimeout_sec = 60\n",
                      "tests/test.sh": TEST_SH, "tests/fixture.gz": FIXTURE, "tests/check": CHECK,
                      "tests/data/pixel.png": PNG_LIKE, "solution/payload.gz": FIXTURE,
                      "solution/unpack": UNPACK, "solution/solve.sh": "/solution/run-unpack\n",
                      "solution/wrong.sh": "echo wrong > /app/out.txt\n",
                      "tests/secret.txt": "sealed", "tests/private/inner.txt": "inner"}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data if isinstance(data, bytes) else data.encode())
    os.chmod(root / "tests" / "check", 0o755)
    os.chmod(root / "solution" / "unpack", 0o755)
    os.chmod(root / "tests" / "data", 0o711)
    os.chmod(root / "tests" / "secret.txt", 0o600)
    os.chmod(root / "tests" / "private", 0o700)
    (root / "tests" / "empty").mkdir()
    (root / "tests" / "expected.gz").symlink_to("fixture.gz")
    (root / "solution" / "run-unpack").symlink_to("unpack")
    return root


def test_tests_and_solution_load_as_entries(tmp_path):
    task = load_harbor_task(_folder(tmp_path)).task(0, "train")
    tests, solution = task.verifier["tests"], task.reference["solution"]
    assert tests["test.sh"] == TEST_SH  # UTF-8 and 0644: text, as before
    assert FileEntry.model_validate(tests["fixture.gz"]) == FileEntry.file(FIXTURE)
    assert FileEntry.model_validate(tests["check"]) == FileEntry.file(CHECK, 0o755)
    assert FileEntry.model_validate(tests["data"]) == FileEntry.directory(0o711)
    assert FileEntry.model_validate(tests["empty"]) == FileEntry.directory()
    assert FileEntry.model_validate(tests["expected.gz"]) == FileEntry.symlink("fixture.gz")
    assert FileEntry.model_validate(solution["run-unpack"]) == FileEntry.symlink("unpack")
    assert FileEntry.model_validate(solution["payload.gz"]).data == FIXTURE


def test_a_text_only_folder_keeps_its_task_hash(tmp_path):
    """Folders of 0644 text files are carried as before: their tasks (and stored runs) match."""
    from posttrain.tasks.families.terminal import EXAMPLES_DIR

    task = load_harbor_task(EXAMPLES_DIR / "fix-config").task(0, "train")
    assert all(isinstance(v, str) for v in task.verifier["tests"].values())
    assert all(isinstance(v, str) for v in task.reference["solution"].values())
    # its hash when tests/ and solution/ carried text only (measured on that code)
    assert task.hash == "29c87fff3e5fba827ff7820fb59a4da7354dc1ca27eba828fe69505e8cb9cf78"


@pytest.mark.parametrize("edit, match", [
    (lambda p: (p / "tests" / "escape").symlink_to("../task.toml"), "tests/escape: symlink 'escape'"),
    (lambda p: (p / "tests" / "abs").symlink_to("/etc/passwd"), "tests/abs: symlink 'abs'"),
    (lambda p: os.mkfifo(p / "solution" / "pipe"), "solution/pipe: not a file, directory or"),
    (lambda p: (p / "tests" / "conftest.py").write_bytes(b"\xff\xfe"), "tests/conftest.py: must be a UTF-8"),
])
def test_what_cannot_be_carried_names_the_file(tmp_path, edit, match):
    root = _folder(tmp_path)
    edit(root)
    with pytest.raises(HarborTaskError, match=match):
        load_harbor_task(root)


@pytest.mark.slow
@pytest.mark.skipif(bwrap_problem() is not None, reason=f"bubblewrap: {bwrap_problem()}")
def test_binary_fixtures_modes_and_links_are_graded_exactly(tmp_path, sandbox, module_sandbox):
    from posttrain.envs import play_actions

    domain = load_harbor_task(_folder(tmp_path))
    task = domain.task(0, "train")
    v = play_actions(domain, task, domain.oracle(task), sandbox=sandbox)
    assert v.passed and v.score == 1.0, dict(v.details)
    for name in ("wrong", "empty"):
        module_sandbox[0].restore(module_sandbox[1])
        v = play_actions(domain, task, domain.negatives(task)[name], sandbox=sandbox)
        assert not v.passed and v.details["reward"] == 0.0, (name, dict(v.details))
