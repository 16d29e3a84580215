"""Harbor conformance, file fidelity through `Task.files` / `Task.entries`: binary files, exact
modes (setuid, setgid, sticky, exec), empty directories and symlinks inside the task go from a
task folder into the episode's workspace, through the store, the grading workspace and replay,
unchanged. (Fidelity inside a built image: `tests/test_harbor_images.py`.)"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from posttrain.sandbox.bwrap import bwrap_problem
from posttrain.values.task import FileEntry, Task

BINARY = bytes(range(256)) * 4
EXPECTED_STAT = [  # `stat -c '%n %a %F'` of every entry, as the sandbox's own user sees them
    "ws/bin 755 directory", "ws/bin/data.bin 644 regular file", "ws/bin/tool 755 regular file",
    "ws/bin/tool-link 777 symbolic link", "ws/drop 1777 directory", "ws/empty 755 directory",
    "ws/notes.txt 644 regular file", "ws/secret.txt 600 regular file", "ws/shared 2775 directory",
    "ws/shared/up-link 777 symbolic link", "ws/suid 4755 regular file"]
STAT_CMD = ("cd .. && find ws -mindepth 1 -not -path 'ws/.*' | sort | "
            "xargs stat -c '%n %a %F' && readlink ws/bin/tool-link ws/shared/up-link && "
            "ls -A ws/empty | wc -l && ./ws/bin/tool")


# a Harbor-graded task over the folder: its test sees the inputs as they were given
TEST_SH = r"""cd /app
if [ "$(stat -c %a suid shared drop bin/tool | tr '\n' ' ')" = "4755 2775 1777 755 " ] && [ -d empty ] \
   && [ "$(readlink bin/tool-link)" = tool ] && cmp -s bin/data.bin shared/up-link; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
"""
TASK_TOML = f"""domain = "terminal.harbor.fidelity"
env = "tools"
prompt = "look around"
files_from = "ws"
limits = {{ max_turns = 3 }}
[verifier]
timeout_s = 30
tests = {{ "test.sh" = '''{TEST_SH}''' }}
"""


def _folder(root: Path) -> Path:
    """A task folder with one of each kind of entry text cannot carry."""
    ws = root / "ws"
    (ws / "bin").mkdir(parents=True)
    (ws / "bin" / "data.bin").write_bytes(BINARY)
    (ws / "bin" / "tool").write_text("#!/bin/sh\necho tool ran\n")
    os.chmod(ws / "bin" / "tool", 0o755)
    (ws / "bin" / "tool-link").symlink_to("tool")
    (ws / "suid").write_bytes(b"\x7fELF-not-really")
    (ws / "notes.txt").write_text("plain text\n")
    (ws / "secret.txt").write_text("mode 600\n")
    os.chmod(ws / "secret.txt", 0o600)
    for name, mode in (("empty", 0o755), ("shared", 0o2775), ("drop", 0o1777)):
        (ws / name).mkdir()
        os.chmod(ws / name, mode)
    (ws / "shared" / "up-link").symlink_to("../bin/data.bin")
    os.chmod(ws / "suid", 0o4755)  # after writing: a write by root keeps it, but be explicit
    (root / "task.toml").write_text(TASK_TOML)
    return root / "task.toml"


def test_old_tasks_load_unchanged_and_keep_their_hash():
    # a task as stored before `entries` existed, and its hash then (measured on that code)
    old = '{"domain":"x.y","prompt":"p","files":{"a.txt":"hi"},"key":"x.y/train/None"}'
    task = Task.model_validate_json(old)
    assert task.entries == {} and task.files == {"a.txt": "hi"}
    assert task.hash == "a498a2f33c53adc0d63a7c58e18d6c5185059934e589955a7503535f0c7eba98"
    with_entry = task.model_copy(update={"entries": {"b": FileEntry.directory()}})
    assert Task.model_validate_json(with_entry.model_dump_json()).hash != task.hash


@pytest.mark.parametrize("entries, message", [
    ({"l": {"kind": "symlink", "target": "../outside"}}, "leaves the task's files"),
    ({"d/l": {"kind": "symlink", "target": "/etc/passwd"}}, "leaves the task's files"),
    ({"f": {"kind": "file", "mode": "99"}}, "not an octal number"),
    ({"f": {"kind": "file", "mode": 0o17777}}, "outside 0..0o7777"),
    ({"f": {"kind": "file", "b64": "not base64!"}}, "b64 is not base64"),
    ({"d": {"kind": "dir", "target": "x"}}, "only a symlink has a target"),
    ({"a.txt": {"kind": "dir"}}, "in both files and entries"),
    ({"../x": {"kind": "dir"}}, "must be relative"),
])
def test_bad_entries_are_refused_naming_the_field(entries, message):
    with pytest.raises(ValueError, match=message):
        Task(domain="x.y", prompt="p", files={"a.txt": "hi"}, entries=entries)


def test_a_task_folder_loads_exactly(tmp_path, monkeypatch):
    from posttrain.tasks import files
    from posttrain.tasks.files import TaskFileError, load_task_file

    (task,) = load_task_file(_folder(tmp_path))
    assert task.files == {"notes.txt": "plain text\n"}  # UTF-8 and 0644: plain text, as before
    e = task.entries
    assert e["bin/data.bin"].data == BINARY and e["bin/data.bin"].mode == 0o644
    assert (e["bin/tool"].mode, e["suid"].mode, e["secret.txt"].mode) == (0o755, 0o4755, 0o600)
    assert e["shared"] == FileEntry.directory(0o2775) and e["drop"] == FileEntry.directory(0o1777)
    assert e["empty"] == FileEntry.directory(0o755) and "bin" not in e  # implied by its files
    assert e["bin/tool-link"] == FileEntry.symlink("tool")
    assert e["shared/up-link"] == FileEntry.symlink("../bin/data.bin")

    monkeypatch.setattr(files, "MAX_FOLDER_BYTES", 1000)  # stored with the task: bounded
    with pytest.raises(TaskFileError, match="field 'files_from': more than 1000 bytes of files"):
        load_task_file(tmp_path / "task.toml")
    monkeypatch.undo()
    (tmp_path / "ws" / "escape").symlink_to("../../etc/passwd")
    with pytest.raises(TaskFileError, match=r"ws/escape: field 'files_from': symlink 'escape'"):
        load_task_file(tmp_path / "task.toml")
    (tmp_path / "ws" / "escape").unlink()
    os.mkfifo(tmp_path / "ws" / "pipe")
    with pytest.raises(TaskFileError, match="pipe: field 'files_from': not a file, directory or"):
        load_task_file(tmp_path / "task.toml")


needs_bwrap = pytest.mark.skipif(bwrap_problem() is not None, reason=f"bubblewrap: {bwrap_problem()}")


@needs_bwrap
def test_the_workspace_store_grading_and_replay_keep_every_entry(tmp_path):
    from posttrain.envs.workspace import write_task_files
    from posttrain.rollout.replay import restore_workspace
    from posttrain.sandbox import open_sandbox
    from posttrain.storage.store import Store
    from posttrain.tasks.files import load_task_file
    from posttrain.values.task import sha256_text
    from posttrain.values.trajectory import Trajectory
    from posttrain.verifiers.base import Outcome
    from posttrain.verifiers.grading import grading_context

    (task,) = load_task_file(_folder(tmp_path))
    traj = Trajectory(task_key=task.key, task_hash=task.hash, domain=task.domain, split="train",
                      policy_version="v", status="completed", reward=1.0, group_id="g", run_id="r")
    with Store(tmp_path / "store.sqlite") as store:
        store.put_trajectory(traj, task)
    with Store(tmp_path / "store.sqlite", readonly=True) as store:
        stored = store.get_task(task.hash)
    assert stored == task and stored.hash == task.hash

    with open_sandbox() as episode:
        assert write_task_files(episode, stored) == 10
        out = episode.run(["/bin/sh", "-c", STAT_CMD]).stdout.splitlines()
        assert out == EXPECTED_STAT + ["tool", "../bin/data.bin", "0", "tool ran"]
        assert episode.read_file("bin/data.bin") == BINARY
        archive = episode.archive()
        # grading: a fresh sandbox with the episode's files and the task's pristine inputs, which
        # win over what the episode did to them (here: deleted, and a mode changed)
        episode.run("rm -r empty bin/tool-link && chmod 755 suid")
        with grading_context(Outcome("", episode), pristine=stored.workspace()) as graded:
            out = graded.run(["/bin/sh", "-c", STAT_CMD]).stdout.splitlines()
            assert out == EXPECTED_STAT + ["tool", "../bin/data.bin", "0", "tool ran"]
    # replay: a stored workspace archive restored into a fresh sandbox is byte for byte the same
    with open_sandbox() as replayed:
        assert restore_workspace(replayed, archive) == 5  # regular files
        assert replayed.archive() == archive
        assert sha256_text(replayed.archive()) == sha256_text(archive)


@needs_bwrap
def test_a_tools_episode_starts_with_every_entry(tmp_path):
    from posttrain.envs import default_sandbox_factory
    from posttrain.envs.tools import ToolEnv
    from posttrain.tasks.domain import Domain
    from posttrain.tasks.families.terminal.harbor import HARBOR
    from posttrain.tasks.files import load_task_file

    (task,) = load_task_file(_folder(tmp_path))
    domain = Domain(name=task.domain, family="terminal", env="tools", verifier=HARBOR,
                    generate=lambda seed, split: task, oracle=lambda t: [], negatives=lambda t: {})
    env = ToolEnv(domain, sandbox_factory=default_sandbox_factory())
    try:
        first = env.reset(task).text
        assert "Files in the workspace: bin/data.bin, bin/tool, bin/tool-link, drop/, empty/" in first
        result = env.step(f"<bash>{STAT_CMD}</bash>")
        assert "\n".join(EXPECTED_STAT) in result.observation.text
        result = env.step("<submit></submit>")  # graded by tests/test.sh, which checks them too
        assert result.verdict is not None and result.verdict.passed, result.verdict
    finally:
        env.close()
