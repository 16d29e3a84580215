"""Thin ctypes wrappers for the few Linux calls the supervisor needs (Python 3.11 has no
`os.unshare` or `os.setns`, and calling `mount(8)` would cost an exec per snapshot)."""

from __future__ import annotations

import ctypes
import ctypes.util
import os

CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MS_SHARED = 1 << 20
MNT_DETACH = 2
PR_CAPBSET_DROP = 24

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                        ctypes.c_char_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
_libc.unshare.argtypes = [ctypes.c_int]
_libc.setns.argtypes = [ctypes.c_int, ctypes.c_int]
_libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong,
                        ctypes.c_ulong]


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _b(s: str | None) -> bytes | None:
    return None if s is None else s.encode()


def mount(source: str | None, target: str, fstype: str | None, flags: int = 0,
          data: str | None = None) -> None:
    _check(_libc.mount(_b(source), _b(target), _b(fstype), flags, _b(data)),
           f"mount {source} on {target} ({fstype}, {data})")


def umount(target: str, flags: int = 0) -> None:
    _check(_libc.umount2(_b(target), flags), f"umount {target}")


def unshare_mount_namespace() -> None:
    """A private mount namespace: nothing mounted here is seen by the host, and it all goes
    away when the last process in it exits."""
    _check(_libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    mount(None, "/", None, MS_REC | MS_PRIVATE)


def bind(source: str, target: str, *, readonly: bool = False) -> None:
    mount(source, target, None, MS_BIND | MS_REC)
    if readonly:
        mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)


def make_shared(target: str) -> None:
    """Mounts made on `target` from now on propagate to its copies (the sandbox's)."""
    mount(None, target, None, MS_SHARED)


def setns(fd: int, nstype: int) -> None:
    _check(_libc.setns(fd, nstype), f"setns({nstype:#x})")


def drop_bounding_set() -> None:
    """Empty the capability bounding set: no process started from here can ever gain a
    capability again (through a setuid or file-capability binary), whatever its uid. The
    supervisor keeps the capabilities it already has."""
    cap = 0
    while _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) == 0:
        cap += 1
