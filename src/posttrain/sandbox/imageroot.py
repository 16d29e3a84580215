"""An image as the sandbox's root: writable, root-owned inside, thrown away with the episode.

`rootfs.py` gives a plain sandbox a read-only root made of host directories. An *image* sandbox
(a built `posttrain.images` image, or one step of a build) gets instead:

* `/` = an overlay whose lower layers are the image's layers (top first, the base skeleton at
  the bottom: generated `/etc`, empty `/home`, `/root`, `/var`, ...), each an idmapped bind
  (`idmap.py`) so that disk id k is id k inside, and whose upper layer is on the supervisor's
  tmpfs (capped by the workspace size): `useradd`, `apt-get`, writes to `/etc`, `/usr/local/bin`
  or `/var/log` work, and vanish with the sandbox or its reset;
* host directories the image borrows (the host's `/usr`, `/var/lib/dpkg`, the interpreter of a
  Python base) = nested overlays at their paths, with the image layers' parts of those paths
  above the host directory, so they are writable inside in the same way and never on the host;
* `/proc`, a minimal `/dev`, `/tmp` and `/dev/shm` as in a plain sandbox, and the job server's
  interpreter read-only under `/opt/posttrain` (so `python3` is the image's own);
* the workspace (the image's WORKDIR, e.g. `/app`) is the usual snapshot stack (`overlay.py`)
  whose pristine layers are the image layers' parts of that directory.

Between episodes, `reset` unmounts all of it and mounts it again over the same layers with
empty uppers (the job server is restarted: its root is the old tree). A build commits a step by
`commit`: the uppers, merged into one tree with owners shifted back to disk ids, become the
next layer.
"""

from __future__ import annotations

import os
import stat

from posttrain.sandbox import idmap, mounts, rootfs
from posttrain.sandbox.overlay import copy_layer

OPT = "opt/posttrain"
"""where the job server's interpreter and helpers live inside an image (never the image's own)"""


def _lstat(path: str) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except OSError:
        return None


def _has(path: str) -> bool:
    return os.path.isdir(path) and not os.path.islink(path)


class ImageRoot:
    """Assembles `root/` (the supervisor's working directory is its tmpfs) for `image` (see
    `BwrapRunner`): `layers` top first, `host` (inside path, host path) pairs, `workspace`."""

    def __init__(self, image: dict, userns_fd: int, base_uid: int) -> None:
        self.image = image
        self.nsfd = userns_fd
        self.base = base_uid
        self.layer_src: list[str] = []
        self.uppers: list[tuple[str, str]] = []
        """(inside path, upper dir) of every writable overlay but the workspace's"""
        self.generation = 0
        self.trash: list[str] = []
        """upper directories of torn-down trees, deleted after the reply"""

    def bind_layers(self) -> None:
        """Idmapped binds of the layers and host directories (once per supervisor)."""
        os.mkdir("img", 0o700)
        for n, path in enumerate(self.image["layers"]):
            os.mkdir(f"img/{n}")
            idmap.idmapped_bind(path, f"img/{n}", self.nsfd, readonly=True)
            self.layer_src.append(f"img/{n}")
        self.host_src = {}
        for n, (at, host) in enumerate(self.image.get("host", ())):
            os.mkdir(f"img/h{n}")
            idmap.idmapped_bind(host, f"img/h{n}", self.nsfd, readonly=True)
            self.host_src[at] = f"img/h{n}"

    def _overlay(self, at: str, lowers: list[str]) -> None:
        self.generation += 1
        n = len(self.uppers)
        upper, work = f"iu/{self.generation}.{n}", f"iw/{self.generation}.{n}"
        os.makedirs(upper, 0o755)
        os.makedirs(work, 0o700)
        os.chown(upper, self.base, self.base)
        target = "root" + (at if at != "/" else "")
        mounts.mount("overlay", target, "overlay", mounts.MS_NODEV,
                     f"lowerdir={':'.join(lowers)},upperdir={upper},workdir={work}")
        self.uppers.append((at, upper))

    def assemble(self, layout: dict, inside_dir: str) -> None:
        """Mount the tree under `root/` (an empty directory)."""
        self.uppers = []
        os.makedirs("iu", 0o755, exist_ok=True)
        os.makedirs("iw", 0o700, exist_ok=True)
        self._overlay("/", list(self.layer_src))
        for at in sorted(self.host_src, key=lambda p: p.count("/")):
            lowers = [f"{src}{at}" for src in self.layer_src if _has(f"{src}{at}")]
            self._overlay(at, lowers + [self.host_src[at]])
        self._job_server(layout, inside_dir)
        rootfs._dev()
        rootfs._base("root/tmp")
        ws = self.image.get("workspace")
        if ws:
            rootfs._base(f"root{ws}")

    def workspace_lowers(self) -> list[str]:
        ws = self.image.get("workspace")
        return [f"{src}{ws}" for src in self.layer_src if _has(f"{src}{ws}")]

    def _job_server(self, layout: dict, inside_dir: str) -> None:
        """The project's interpreter, site-packages and `inside/` at /opt/posttrain, read-only
        (the skeleton has the mount points, `images/base.py`)."""
        py = f"root/{OPT}/python"
        if layout["inside_base"] != "/usr":
            idmap.idmapped_bind(layout["base"], py, self.nsfd, readonly=True)
        if layout["venv"]:
            site = f"root/{OPT}/venv/lib/{layout['version']}/site-packages"
            idmap.idmapped_bind(layout["site"], site, self.nsfd, readonly=True)
        idmap.idmapped_bind(inside_dir, f"root/{OPT}/inside", self.nsfd, readonly=True)

    def teardown(self) -> None:
        """Unmount the whole tree (lazily: a dying process may still hold it)."""
        mounts.umount("root", mounts.MNT_DETACH)
        self.trash += [upper for _, upper in self.uppers] + [
            "iw/" + name for name in os.listdir("iw")]
        self.uppers = []

    def commit(self, dest: str) -> None:
        """Merge the uppers into a new layer directory `dest` (disk ids), for a build step."""
        root_upper = dict(self.uppers)["/"]
        copy_layer(root_upper, dest)
        for at, upper in self.uppers:
            if at == "/":
                continue
            target = dest + at
            if not os.path.isdir(target):
                os.makedirs(target, 0o755)
            for name in os.listdir(upper):
                copy_layer(os.path.join(upper, name), os.path.join(target, name))
        if self.image.get("network"):  # bubblewrap's empty mount points for the host's files
            for path in ("etc/resolv.conf", "etc/hosts"):
                st = _lstat(os.path.join(dest, path))
                if st is not None and stat.S_ISREG(st.st_mode) and st.st_size == 0:
                    os.unlink(os.path.join(dest, path))
        idmap.shift_owners(dest, self.base, to_disk=True)
