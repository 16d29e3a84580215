"""Copy-on-write workspace snapshots: overlayfs layers on the supervisor's tmpfs.

Layout (paths relative to the supervisor's tmpfs, its working directory): `h` is the mountpoint
bound into the sandbox at /ws, a bind mount made *shared*; `l/N` and `u/N` are layers, `w/N`
overlay work directories. bubblewrap 0.8 has no `--overlay`, so the supervisor (root, in its
private mount namespace) mounts the overlays itself.

* snapshot (nothing running): the current upper layer is frozen, i.e. becomes a lower layer of
  a new overlay with an empty upper. O(1). A frozen layer is never written again, so a snapshot
  cannot change after it is taken.
* snapshot (processes running, e.g. a background server): they may hold the current overlay
  (cwd, open files) and keep writing through it, so the upper layer is *copied* into a new
  frozen layer instead, O(files changed since the last snapshot), and they carry on.
* restore: a new overlay, empty upper over the snapshot's layers (the caller kills the
  sandbox's processes first). The discarded upper layer is deleted later (`collect_trash`).

Every new overlay is mounted *on top of* the current one, never after unmounting it: the mount
event then propagates into the running sandbox (bubblewrap made its copy of our mount a slave),
so the job server sees the new /ws without a restart. The buried overlays cost a mount each.
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



class OverlayWorkspace:
    def __init__(self, uid: int) -> None:
        self.uid = uid
        """host uid that owns the workspace (the sandbox's)"""
        self.snapshots: dict[str, list[str]] = {}
        """snapshot id -> its layers, top first"""
        self.frozen: set[str] = set()
        self.trash: list[str] = []
        self.upper = ""
        self.lowers: list[str] = []
        self.count = 0

    def boot(self) -> None:
        for d in ("h", "l", "l/0", "u", "w"):
            os.mkdir(d, 0o755)
        mounts.bind("h", "h")
        mounts.mount(None, "h", None, mounts.MS_SHARED)  # so later overlays propagate inside
        self._mount(["l/0"])

    def _mount(self, lowers: list[str]) -> None:
        if len(lowers) > MAX_LAYERS:
            raise RuntimeError(f"too many snapshot layers ({len(lowers)} > {MAX_LAYERS})")
        self.count += 1
        upper, work = f"u/{self.count}", f"w/{self.count}"
        os.mkdir(upper, 0o755)
        os.mkdir(work, 0o700)
        os.chown(upper, self.uid, self.uid)
        mounts.mount("overlay", "h", "overlay", mounts.MS_NOSUID | mounts.MS_NODEV,
                     f"lowerdir={':'.join(lowers)},upperdir={upper},workdir={work}")
        self.upper, self.lowers = upper, lowers

    def snapshot(self, *, live: bool) -> str:
        """A new snapshot id; `live`: processes run in the sandbox (see the module docstring)."""
        sid = f"snap-{len(self.snapshots) + 1}"
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

    def collect_trash(self) -> None:
        """Delete discarded upper layers (after the reply to the host: off its clock)."""
        while self.trash:
            shutil.rmtree(self.trash.pop(), ignore_errors=True)
