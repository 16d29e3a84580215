"""Host uids for sandboxes: one unused, unprivileged uid per live sandbox.

Run as root, posttrain launches each bubblewrap sandbox as its own host uid (never root, and
never the uid of another live sandbox, so that RLIMIT_NPROC counts one sandbox and a process of
one sandbox can never signal another's). A uid is claimed with an exclusive `flock` on a file
named after it, held for the sandbox's life, so that several posttrain processes on one machine
(several test runs, several trainers) never hand out the same uid. The lock dies with the
process that holds it.
"""

from __future__ import annotations

import fcntl
import os
import signal

SLOT_UID_BASE = 2_100_000
"""first host uid used for sandboxes (far above any uid a distribution hands out)"""
SLOT_COUNT = 8192
LOCK_DIR = "/run/posttrain/sandbox-uids"
RANGE_UID_BASE = 1 << 30
"""first host uid of the uid ranges of image sandboxes (root inside a user namespace, see
`idmap.py`): each live one holds 65536 uids of its own"""
RANGE_COUNT = 4096
RANGE_LOCK_DIR = "/run/posttrain/sandbox-ranges"


class Slot:
    def __init__(self, uid: int, fd: int, count: int = 1) -> None:
        self.uid, self.count = uid, count
        self._fd: int | None = fd

    def release(self, clean: bool = False) -> None:
        """Give the uid back. `clean`: its supervisor saw the sandbox's cgroup empty and exited,
        so the /proc scan for leftovers (~20 ms) can be skipped, here and by the next owner."""
        if self._fd is not None:
            if not clean:
                kill_uid(self.uid, self.count)  # nothing of this sandbox survives into the next owner's
            os.ftruncate(self._fd, 0)
            os.pwrite(self._fd, b"clean", 0)
            os.close(self._fd)
            self._fd = None


def kill_uid(uid: int, count: int = 1) -> int:
    """SIGKILL every live process whose real uid is in `uid`..`uid+count-1` (scans /proc);
    returns how many.
    Zombies are not counted: they are dead already, only waiting for their parent."""
    n = 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status", "rb") as f:
                state = b""
                for line in f:
                    if line.startswith(b"State:"):
                        state = line.split()[1]
                    elif line.startswith(b"Uid:"):
                        if uid <= int(line.split()[1]) < uid + count and state not in (b"Z", b"X"):
                            os.kill(int(name), signal.SIGKILL)
                            n += 1
                        break
        except (OSError, ValueError):
            continue
    return n


def acquire_slot(uid_range: bool = False) -> Slot:
    """A free uid (`uid_range`: a free range of 65536 uids, for an image sandbox)."""
    lock_dir, n, base, width = ((RANGE_LOCK_DIR, RANGE_COUNT, RANGE_UID_BASE, 65536) if uid_range
                                else (LOCK_DIR, SLOT_COUNT, SLOT_UID_BASE, 1))
    os.makedirs(lock_dir, mode=0o700, exist_ok=True)
    start = (os.getpid() * 7919) % n
    for i in range(n):
        uid = base + ((start + i) % n) * width
        fd = os.open(os.path.join(lock_dir, str(uid)), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC,
                     0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        if os.pread(fd, 16, 0) != b"clean":
            kill_uid(uid, width)  # leftovers of an owner killed before it could clean up
        os.ftruncate(fd, 0)
        os.pwrite(fd, b"in use", 0)
        return Slot(uid, fd, width)
    raise RuntimeError(f"all {n} sandbox uids (or uid ranges) are in use")
