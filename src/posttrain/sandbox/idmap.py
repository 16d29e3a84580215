"""Root inside, nobody outside: a user namespace with a range of uids, and idmapped mounts.

An image sandbox (see `imageroot.py`) runs its commands as uid 0 *inside* a user namespace
whose uids 0..65535 are host uids `base`..`base`+65535 (`ranges.py` gives every live sandbox
its own, far above any real user): root there may chown, setuid between its own uids and write
what it owns, and owns nothing on the host. Such a namespace is made by a child that takes the
range's first uid and unshares, after which the supervisor (real root) writes the mapping: only
a privileged writer may map more than the writer's own uid. The child also sets
`user.max_user_namespaces` to 0 inside, so the sandbox cannot nest further namespaces (what
bubblewrap's `--disable-userns` does, which it only offers with its own `--unshare-user`).

Files on disk (the host's `/usr`, cached image layers) are owned by ids as the image sees them
(0 = root). An *idmapped* bind (`mount_setattr(MOUNT_ATTR_IDMAP)`, Linux >= 5.12; overlayfs
accepts idmapped layers since 5.19) shows disk id k as host id base+k, i.e. as k inside: the
host's root-owned `/usr` is root's inside, and never writable on the host (overlays copy up).
"""

from __future__ import annotations

import ctypes
import os
import re
import stat
import struct

RANGE = 65536
CLONE_NEWUSER = 0x10000000
_SYS_OPEN_TREE, _SYS_MOVE_MOUNT, _SYS_MOUNT_SETATTR = 428, 429, 442  # x86-64 and arm64 alike
OPEN_TREE_CLONE, OPEN_TREE_CLOEXEC = 1, 0o2000000
AT_EMPTY_PATH, AT_RECURSIVE, AT_FDCWD = 0x1000, 0x8000, -100
MOVE_MOUNT_F_EMPTY_PATH = 0x4
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID, MOUNT_ATTR_NODEV = 0x1, 0x2, 0x4
MOUNT_ATTR_IDMAP = 0x100000

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class IdmapUnavailable(RuntimeError):
    """The kernel cannot make idmapped mounts or user namespaces with a uid range here."""


MIN_KERNEL = (5, 19)
"""the oldest Linux whose overlayfs takes idmapped lower layers (idmapped mounts alone: 5.12)"""
FEATURE = ("overlayfs over idmapped layers (an image's files owned by root inside a user "
           "namespace, written over in an overlay)")


def kernel_problem(release: str | None = None) -> str | None:
    """Why this kernel (`release`, default the running one) cannot run image sandboxes or
    builds, or None. An unparsable release is not refused here (the mounts then decide)."""
    release = release if release is not None else os.uname().release
    m = re.match(r"(\d+)\.(\d+)", release)
    if m is None or (int(m[1]), int(m[2])) >= MIN_KERNEL:
        return None
    need = ".".join(map(str, MIN_KERNEL))
    return f"image sandboxes need Linux >= {need} for {FEATURE}; this kernel is {release}"


def user_namespace(base: int, count: int = RANGE,
                   mapping: list[tuple[int, int, int]] | None = None) -> int:
    """An fd of a new user namespace owned by host uid `base` that maps ids 0..count-1 to
    host ids base..base+count-1 (uids and gids) and allows no nested user namespace.
    `mapping`: (inside, host, count) lines instead (`base` must be mapped by one of them)."""
    lines = "".join(f"{a} {b} {n}\n" for a, b, n in (mapping or [(0, base, count)]))
    ready_r, ready_w = os.pipe2(os.O_CLOEXEC)
    go_r, go_w = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child only unshares and waits
        code = 1
        try:
            os.close(ready_r)
            os.close(go_w)
            os.setgroups([])
            os.setresgid(base, base, base)
            os.setresuid(base, base, base)
            if _libc.unshare(CLONE_NEWUSER) == 0:
                os.write(ready_w, b"u")
                if os.read(go_r, 1) == b"g":
                    with open("/proc/sys/user/max_user_namespaces", "w") as f:
                        f.write("0")
                    os.write(ready_w, b"d")
                    os.read(go_r, 1)  # hold the namespace until the parent has its fd
                    code = 0
        finally:
            os._exit(code)
    os.close(ready_w)
    os.close(go_r)
    try:
        if os.read(ready_r, 1) != b"u":
            raise IdmapUnavailable("could not create a user namespace (unshare(CLONE_NEWUSER))")
        for name in ("uid_map", "gid_map"):
            with open(f"/proc/{pid}/{name}", "w") as f:
                f.write(lines)
        os.write(go_w, b"g")
        if os.read(ready_r, 1) != b"d":
            raise IdmapUnavailable("could not limit nested user namespaces in the sandbox's")
        return os.open(f"/proc/{pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        os.close(go_w)
        os.close(ready_r)
        os.waitpid(pid, 0)


def idmapped_bind(source: str, target: str, userns_fd: int, *, readonly: bool = False) -> None:
    """Bind `source` at `target` with disk ids shifted through `userns_fd`'s mapping."""
    fd = _libc.syscall(_SYS_OPEN_TREE, AT_FDCWD, source.encode(),
                       OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE)
    if fd < 0:
        raise OSError(ctypes.get_errno(), f"open_tree {source}")
    try:
        flags = MOUNT_ATTR_IDMAP | MOUNT_ATTR_NODEV | (MOUNT_ATTR_RDONLY if readonly else 0)
        attr = ctypes.create_string_buffer(struct.pack("QQQQ", flags, 0, 0, userns_fd))
        if _libc.syscall(_SYS_MOUNT_SETATTR, fd, b"", AT_EMPTY_PATH, attr, 32) < 0:
            err = ctypes.get_errno()
            raise IdmapUnavailable(f"idmapped mount of {source} refused ({os.strerror(err)}): "
                                   f"image sandboxes need Linux >= 5.19 (this kernel is "
                                   f"{os.uname().release}) and a filesystem that supports "
                                   "idmapped mounts")
        if _libc.syscall(_SYS_MOVE_MOUNT, fd, b"", AT_FDCWD, target.encode(),
                         MOVE_MOUNT_F_EMPTY_PATH) < 0:
            raise OSError(ctypes.get_errno(), f"move_mount {source} -> {target}")
    finally:
        os.close(fd)


def shift_owners(tree: str, base: int, *, to_disk: bool) -> None:
    """Rewrite owners under `tree`: host base+k -> disk k (`to_disk`), or back. Ids outside the
    range (none should be there) become 0 (root's) on the way to disk."""
    def shift(i: int) -> int:
        if to_disk:
            return i - base if base <= i < base + RANGE else 0
        return i + base

    def one(path: str) -> None:
        st = os.lstat(path)
        os.chown(path, shift(st.st_uid), shift(st.st_gid), follow_symlinks=False)
        if not stat.S_ISLNK(st.st_mode) and st.st_mode & 0o6000:
            os.chmod(path, st.st_mode & 0o7777)  # chown clears setuid/setgid: keep them

    one(tree)
    for dirpath, dirnames, filenames in os.walk(tree):
        for name in dirnames + filenames:
            one(os.path.join(dirpath, name))
