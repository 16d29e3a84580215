"""The sandbox's writable places as stacks of mounts: workspace snapshots (overlayfs layers on
the supervisor's tmpfs) and the reset to pristine of /ws, /tmp and /dev/shm.

Each writable place of the sandbox is a *base* mount (an empty, read-only, shared tmpfs that
`rootfs.py` puts at `root/ws`, `root/tmp`, `root/dev/shm`) with writable mounts stacked on it.
bubblewrap copies the whole tree into the sandbox as slaves of ours, so a mount made on top of
the stack here appears inside the running sandbox, and unmounting the top here unmounts it
there: the job server sees a new /ws without a restart. Workspace layers live on the supervisor's
tmpfs (paths relative to it, its working directory): `l/N` and `u/N` are layers, `w/N` overlay
work directories. bubblewrap 0.8 has no `--overlay`, so the supervisor (root, in its private
mount namespace) mounts the overlays itself.

* snapshot (nothing running): the current upper layer is frozen, i.e. becomes a lower layer of
  a new overlay with an empty upper. O(1). A frozen layer is never written again, so a snapshot
  cannot change after it is taken.
* snapshot (processes running, e.g. a background server): they may hold the current overlay
  (cwd, open files) and keep writing through it, so the upper layer is *copied* into a new
  frozen layer instead, O(files changed since the last snapshot), and they carry on.
* restore: a new overlay, empty upper over the snapshot's layers, stacked on the current one
  (the caller kills the sandbox's processes first). The discarded upper layer is deleted later
  (`collect_trash`).
* reset (between episodes, nothing running): every mount above the base is unmounted and one
  fresh overlay over the pristine layers (tmpfs for /tmp and /dev/shm) is mounted: O(1) mounts,
  whatever the episode wrote, and the stack never grows from one episode to the next. Every
  layer and snapshot of the episode is deleted after the reply.
"""

from __future__ import annotations

import os
import shutil
import stat

from posttrain.sandbox import mounts

MAX_LAYERS = 400
"""an overlay mount takes at most ~500 lower layers (and one page of options)"""


def copy_layer(src: str, dst: str) -> None:
    """Copy an overlay upper layer exactly: contents, modes, owners, symlinks, whiteouts (0/0
    character devices) and overlay xattrs (opaque directories). Done in-process because the
    supervisor's children have no capabilities (its bounding set is empty), so `cp -a` could
    not keep owners."""
    def copy(s: str, d: str) -> None:
        st = os.lstat(s)
        if stat.S_ISDIR(st.st_mode):
            os.mkdir(d)
            for name in os.listdir(s):
                copy(os.path.join(s, name), os.path.join(d, name))
        elif stat.S_ISLNK(st.st_mode):
            os.symlink(os.readlink(s), d)
            os.chown(d, st.st_uid, st.st_gid, follow_symlinks=False)
            return
        elif stat.S_ISREG(st.st_mode):
            shutil.copyfile(s, d, follow_symlinks=False)
        elif stat.S_ISCHR(st.st_mode) or stat.S_ISFIFO(st.st_mode):
            os.mknod(d, st.st_mode, st.st_rdev)
        else:
            return  # sockets: not workspace content
        os.chown(d, st.st_uid, st.st_gid)
        os.chmod(d, stat.S_IMODE(st.st_mode))
        for name in os.listxattr(s, follow_symlinks=False):
            os.setxattr(d, name, os.getxattr(s, name, follow_symlinks=False))

    copy(src, dst)



def _pop_all(target: str, depth: int) -> None:
    # MNT_DETACH: bubblewrap's pid 1 may still have its working directory on an old copy;
    # it never writes there, and the copy goes away with its last reference
    for _ in range(depth):
        mounts.umount(target, mounts.MNT_DETACH)


class OverlayWorkspace:
    """The workspace stack at `target` (an empty shared base mount made by `rootfs.py`)."""

    def __init__(self, uid: int, target: str = "root/ws") -> None:
        self.uid = uid
        """host uid that owns the workspace (the sandbox's)"""
        self.target = target
        self.snapshots: dict[str, list[str]] = {}
        """snapshot id -> its layers, top first"""
        self.pristine = ["l/0"]
        """the layers of a fresh workspace (empty): what `reset` goes back to"""
        self.frozen: set[str] = set()
        self.trash: list[str] = []
        self.upper = ""
        self.lowers: list[str] = []
        self.count = 0
        self.depth = 0
        """overlays stacked on the base"""
        self.next_id = 1
        """snapshot ids are never reused, so an old episode's id cannot name a new snapshot"""

    def boot(self) -> None:
        for d in ("l", "l/0", "u", "w"):
            os.mkdir(d, 0o755)
        self._mount(self.pristine)

    def _mount(self, lowers: list[str]) -> None:
        if len(lowers) > MAX_LAYERS:
            raise RuntimeError(f"too many snapshot layers ({len(lowers)} > {MAX_LAYERS})")
        self.count += 1
        upper, work = f"u/{self.count}", f"w/{self.count}"
        os.mkdir(upper, 0o755)
        os.mkdir(work, 0o700)
        os.chown(upper, self.uid, self.uid)
        mounts.mount("overlay", self.target, "overlay", mounts.MS_NOSUID | mounts.MS_NODEV,
                     f"lowerdir={':'.join(lowers)},upperdir={upper},workdir={work}")
        self.upper, self.lowers = upper, lowers
        self.depth += 1

    def snapshot(self, *, live: bool) -> str:
        """A new snapshot id; `live`: processes run in the sandbox (see the module docstring)."""
        sid = f"snap-{self.next_id}"
        self.next_id += 1
        if live:
            self.count += 1
            layer = f"l/{self.count}"
            copy_layer(self.upper, layer)
            self.snapshots[sid] = [layer] + self.lowers
            return sid
        frozen = [self.upper] + self.lowers
        self.frozen.add(self.upper)
        self._mount(frozen)
        self.snapshots[sid] = frozen
        return sid

    def restore(self, sid: str) -> None:
        old = self.upper
        self._mount(self.snapshots[sid])
        if old not in self.frozen:
            self.trash.append(old)

    def reset(self) -> None:
        """Back to a fresh workspace over the pristine layers (nothing may run in the sandbox).
        Every layer of the episode becomes trash (deleted by `collect_trash`)."""
        _pop_all(self.target, self.depth)
        self.depth = 0
        keep = set(self.pristine)
        for top in ("u", "w", "l"):
            self.trash += [f"{top}/{n}" for n in os.listdir(top) if f"{top}/{n}" not in keep]
        self.snapshots.clear()
        self.frozen.clear()
        self._mount(self.pristine)

    def collect_trash(self) -> None:
        """Delete discarded layers (after the reply to the host: off its clock)."""
        while self.trash:
            shutil.rmtree(self.trash.pop(), ignore_errors=True)


class TmpfsStack:
    """/tmp or /dev/shm: a size-capped tmpfs owned by the sandbox's uid, stacked on a base
    mount; a reset replaces it with an empty one (the old one's pages are freed at once)."""

    def __init__(self, target: str, size_bytes: int, uid: int, mode: int = 0o755) -> None:
        self.target, self.size, self.uid, self.depth, self.mode = target, size_bytes, uid, 0, mode

    def push(self) -> None:
        mounts.mount("tmpfs", self.target, "tmpfs", mounts.MS_NOSUID | mounts.MS_NODEV,
                     f"size={self.size},mode={self.mode:04o}")
        os.chown(self.target, self.uid, self.uid)
        self.depth += 1

    def reset(self) -> None:
        _pop_all(self.target, self.depth)
        self.depth = 0
        self.push()
