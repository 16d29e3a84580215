"""Removing the System V IPC objects (shared memory, semaphores, message queues) of a sandbox.

They live in the sandbox's IPC namespace, not in any file or process: a segment created by one
episode would still be there, with its data, for the next episode in the same sandbox. The
supervisor (root) enters that namespace for a moment (`setns`), lists the objects through
`/proc/sysvipc/*` (which shows the reader's namespace) and removes each one (`IPC_RMID`).
"""

from __future__ import annotations

import ctypes
import os

from posttrain.sandbox import mounts

IPC_RMID = 0
KINDS = ("shm", "sem", "msg")

_libc = ctypes.CDLL(None, use_errno=True)


def _ids(kind: str) -> list[int]:
    try:
        with open(f"/proc/sysvipc/{kind}") as f:
            lines = f.read().splitlines()[1:]  # a header line, then one object per line
    except OSError:
        return []
    return [int(line.split()[1]) for line in lines if line.split()]


def _remove(kind: str, ident: int) -> None:
    if kind == "shm":
        _libc.shmctl(ident, IPC_RMID, None)
    elif kind == "sem":
        _libc.semctl(ident, 0, IPC_RMID)
    else:
        _libc.msgctl(ident, IPC_RMID, None)


def clear(pid: int) -> int:
    """Remove every System V IPC object of the IPC namespace of `pid`; returns how many are
    left afterwards (0 when the cleanup worked)."""
    own = os.open("/proc/self/ns/ipc", os.O_RDONLY | os.O_CLOEXEC)
    try:
        target = os.open(f"/proc/{pid}/ns/ipc", os.O_RDONLY | os.O_CLOEXEC)
        try:
            mounts.setns(target, mounts.CLONE_NEWIPC)
        finally:
            os.close(target)
        try:
            for kind in KINDS:
                for ident in _ids(kind):
                    _remove(kind, ident)
            return sum(len(_ids(kind)) for kind in KINDS)
        finally:
            mounts.setns(own, mounts.CLONE_NEWIPC)
    finally:
        os.close(own)
