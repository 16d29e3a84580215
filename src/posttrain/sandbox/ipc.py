"""Removing the System V IPC objects (shared memory, semaphores, message queues) of a sandbox.

They live in the sandbox's IPC namespace, not in any file or process: a segment created by one
episode would still be there, with its data, for the next episode in the same sandbox. The
supervisor (root) enters that namespace for a moment (`setns`), lists the objects through
`/proc/sysvipc/*` (which shows the reader's namespace) and removes each one (`IPC_RMID`).
POSIX message queues (`mq_open`) live in the same namespace's internal mqueue filesystem: the
supervisor mounts that filesystem (a mount made inside the namespace shows its queues) on a
private directory for a moment and unlinks every queue in it.
"""

from __future__ import annotations

import ctypes
import os
import tempfile

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


def _clear_mqueues() -> int:
    """Unlink every POSIX message queue of the current IPC namespace; how many are left."""
    where = tempfile.mkdtemp(prefix="pt-mq-")
    try:
        mounts.mount("mqueue", where, "mqueue", mounts.MS_NOSUID | mounts.MS_NODEV)
        try:
            for name in os.listdir(where):
                os.unlink(os.path.join(where, name))
            return len(os.listdir(where))
        finally:
            mounts.umount(where, mounts.MNT_DETACH)
    finally:
        os.rmdir(where)


def clear(pid: int) -> int:
    """Remove every System V IPC object and POSIX message queue of the IPC namespace of `pid`;
    returns how many are left afterwards (0 when the cleanup worked)."""
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
            return sum(len(_ids(kind)) for kind in KINDS) + _clear_mqueues()
        finally:
            mounts.setns(own, mounts.CLONE_NEWIPC)
    finally:
        os.close(own)
