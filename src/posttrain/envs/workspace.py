"""A task's initial workspace, written into a sandbox exactly: text files, and the entries text
cannot carry (bytes with exact modes, setuid/setgid included; empty directories; symbolic links
inside the task). Every writer of a task's files goes through `write_task_files`: the episode's
environment, and replay."""

from __future__ import annotations

from posttrain.sandbox.base import Sandbox
from posttrain.values.task import Task


def write_task_files(sandbox: Sandbox, task: Task) -> int:
    """Write `task.files` and `task.entries` into `sandbox`'s workspace; returns how many.
    Parents come before their children (a directory's exact mode is set when it is reached, and
    the host writes through read-only modes)."""
    if not task.entries:  # text only: one write per file, as every generated task has
        for path, text in task.files.items():
            sandbox.write_file(path, text)
        return len(task.files)
    entries = task.workspace()
    for path, entry in entries.items():
        if entry.kind == "dir":
            sandbox.make_dir(path, entry.mode if entry.mode is not None else 0o755)
        elif entry.kind == "symlink":
            sandbox.make_symlink(path, entry.target)
        else:
            sandbox.write_file(path, entry.data, mode=entry.mode if entry.mode is not None else 0o644)
    return len(entries)
