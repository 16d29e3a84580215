"""One owner per run directory: an exclusive `flock` on `<run-dir>/.lock`.

`posttrain run`, `posttrain eval --run-dir` and `posttrain rollout` take the lock before they
look at or write anything in the directory, and hold it for the life of the process: the kernel
releases it when the process ends, however it ends (kill -9 included), so a stale lock cannot
outlive its holder and there is nothing to clean up. A second writer is refused at once with the
holder's pid and command line (written into the lock file after the lock is taken; the file's
content is information, the lock is the `flock`).

What it does not cover: a writer on another machine over NFS (flock there depends on the
server), and readers (`export`, `report`, `replay`), which need no lock (the store is SQLite in
WAL mode: readers never see a half-written row).
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
from pathlib import Path

from posttrain.errors import UserError

LOCK_FILE = ".lock"

_held: dict[Path, int] = {}
"""run dir -> fd of the lock this process holds (kept open: closing the fd releases the lock)"""


def holder(run_dir: str | os.PathLike) -> dict | None:
    """What the lock file says about its last holder ({'pid', 'command'}), or None."""
    try:
        return json.loads((Path(run_dir) / LOCK_FILE).read_text() or "null")
    except (OSError, ValueError):
        return None


def acquire(run_dir: str | os.PathLike, what: str = "") -> Path:
    """Take the run directory's lock for the rest of this process (creating the directory), or
    raise `UserError` naming the run and the process that holds it. Taking it again in the same
    process is a no-op."""
    run_dir = Path(run_dir)
    key = run_dir.resolve()
    if key in _held:
        return run_dir
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(run_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except (FileExistsError, NotADirectoryError):
        raise UserError(f"run directory {run_dir} is a file (or under one), not a directory") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        h = holder(run_dir) or {}
        who = f"pid {h.get('pid', '?')}" + (f": {h['command']}" if h.get("command") else "")
        raise UserError(f"run directory {run_dir} is in use by another posttrain process ({who}); "
                        "wait for it to finish, or use another run name / --run-dir") from None
    # Only the holder writes the file, so a reader never sees another writer's half.
    info = json.dumps({"pid": os.getpid(), "command": " ".join(["posttrain", *sys.argv[1:]]),
                       "what": what})
    os.ftruncate(fd, 0)
    os.pwrite(fd, info.encode(), 0)
    _held[key] = fd
    return run_dir


def release(run_dir: str | os.PathLike) -> None:
    """Give the lock back before the process ends (tests; a long-lived caller)."""
    fd = _held.pop(Path(run_dir).resolve(), None)
    if fd is not None:
        os.close(fd)  # closing releases the flock; the file stays (its content is history)
