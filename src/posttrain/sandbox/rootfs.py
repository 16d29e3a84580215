"""The sandbox's root filesystem, assembled by the supervisor and handed to bubblewrap whole.

The supervisor (root, in its private mount namespace, working directory = its tmpfs) builds the
tree under `root/` and bubblewrap binds it as the sandbox's `/` with one recursive bind, adding
only `/proc`. Why not let bubblewrap build it (`--tmpfs`, `--dev`, `--ro-bind` per path): what
bubblewrap mounts, it mounts inside the sandbox's user namespace, so every tmpfs it makes shows
the sandbox's *host* uid in `/proc/self/mountinfo` (`uid=2100123`), its own root shows up as
`/newroot`, and each bind mount shows its host source path (`/root/.pyenv/...`,
`/home/me/project/src/...`). Here:

* tmpfs mounts are made by root (no `uid=` option), then chowned to the sandbox's uid;
* the host directories the sandbox reads (the interpreter, site-packages, `inside/`) are
  read-only overlays whose layers are named by relative paths (`lowerdir=src/1:e`), so
  mountinfo shows neutral names instead of where they live on the host;
* `/dev` is a small tmpfs with the host's null, zero, full, random, urandom and tty bound in,
  a private devpts instance and an empty `/dev/shm` base;
* `/ws`, `/tmp` and `/dev/shm` are empty, read-only, *shared* base mounts: the writable mounts
  stacked on them (`overlay.py`) propagate into the running sandbox.

What this does not hide: `/usr` is the host's (read-only; its device numbers and the ext4
options of the host disk show in mountinfo), and `/proc/cpuinfo`, `/proc/meminfo` describe the
host machine.
"""

from __future__ import annotations

import os
import shutil

from posttrain.sandbox import mounts
from posttrain.sandbox.bwrap import CANDIDATE_UID, INSIDE_UID

PASSWD = ("root:x:0:0:root:/root:/usr/sbin/nologin\n"
          f"sandbox:x:{INSIDE_UID}:{INSIDE_UID}:sandbox:/tmp:/bin/sh\n"
          f"candidate:x:{CANDIDATE_UID}:{CANDIDATE_UID}:candidate:/tmp:/bin/sh\n"
          "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n")
GROUP = f"root:x:0:\nsandbox:x:{INSIDE_UID}:\ncandidate:x:{CANDIDATE_UID}:\nnogroup:x:65534:\n"
HOSTS = "127.0.0.1\tlocalhost sandbox\n::1\tlocalhost\n"
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
DEV_LINKS = {"ptmx": "pts/ptmx", "fd": "/proc/self/fd", "stdin": "/proc/self/fd/0",
             "stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2"}
SMALL = "size=1m,mode=0755"
RO = mounts.MS_RDONLY | mounts.MS_NOSUID | mounts.MS_NODEV


def _ro_tree(host: str, at: str, n: int) -> None:
    """Show the host directory `host` read-only at `at`, as an overlay named `src/n` (the bind
    that gives it that name lives only in the supervisor's namespace, not the sandbox's)."""
    os.makedirs(f"src/{n}", 0o755)
    mounts.bind(host, f"src/{n}")
    # two lower layers and no upper: a read-only overlay (`e` is empty and adds nothing)
    mounts.mount("overlay", at, "overlay", RO, f"lowerdir=src/{n}:e")


def _base(at: str) -> None:
    """An empty, read-only, shared mount: the bottom of a writable place's stack."""
    mounts.mount("tmpfs", at, "tmpfs", RO, SMALL)
    mounts.make_shared(at)


def build(layout: dict, inside_dir: str, root_links: list[str]) -> None:
    """Assemble `root/` in the current directory (the supervisor's tmpfs). `layout` is
    `bwrap.python_layout()`, `root_links` `bwrap._root_links()` (bubblewrap-style arguments)."""
    os.mkdir("e", 0o755)
    os.mkdir("root", 0o755)
    mounts.mount("tmpfs", "root", "tmpfs", mounts.MS_NOSUID | mounts.MS_NODEV, SMALL)
    for d in ("usr", "etc", "opt", "proc", "dev", "tmp", "ws", "opt/posttrain",
              "opt/posttrain/inside"):
        os.mkdir(f"root/{d}", 0o755)
    mounts.bind("/usr", "root/usr", readonly=True)
    _links(root_links)
    _etc()
    n = 0
    if layout["inside_base"] != layout["base"]:
        os.mkdir("root/opt/python", 0o755)
        _ro_tree(layout["base"], "root/opt/python", n)
        n += 1
    if layout["venv"]:
        site = f"root/opt/venv/lib/{layout['version']}/site-packages"
        os.makedirs(site, 0o755)
        os.mkdir("root/opt/venv/bin", 0o755)
        _ro_tree(layout["site"], site, n)
        n += 1
        python = os.path.join(layout["inside_base"], layout["exe"])
        with open("root/opt/venv/pyvenv.cfg", "w") as f:
            f.write(f"home = {os.path.dirname(python)}\n"
                    "include-system-site-packages = false\n"
                    f"version = {layout['full_version']}\n")
        for name in ("python", "python3", layout["version"]):
            os.symlink(python, f"root/opt/venv/bin/{name}")
    _ro_tree(inside_dir, "root/opt/posttrain/inside", n)
    _dev()
    _base("root/ws")
    _base("root/tmp")
    mounts.mount(None, "root", None, mounts.MS_REMOUNT | RO)


def _links(root_links: list[str]) -> None:
    """/bin, /sbin, /lib*: symlinks into /usr (merged /usr) or read-only binds, as on the host."""
    it = iter(root_links)
    for kind, src, dst in zip(it, it, it):
        if kind == "--symlink":
            os.symlink(src, f"root{dst}")
        else:
            os.mkdir(f"root{dst}", 0o755)
            mounts.bind(src, f"root{dst}", readonly=True)


def _etc() -> None:
    for name, text in (("passwd", PASSWD), ("group", GROUP), ("hosts", HOSTS)):
        with open(f"root/etc/{name}", "w") as f:
            f.write(text)
    if os.path.exists("/etc/ld.so.cache"):
        shutil.copyfile("/etc/ld.so.cache", "root/etc/ld.so.cache")
    # Debian reaches many commands (awk, which, vi, pager) through /etc/alternatives links
    # into /usr: copy the links (not any file content) so those commands exist inside.
    if os.path.isdir("/etc/alternatives"):
        os.mkdir("root/etc/alternatives", 0o755)
        for entry in os.scandir("/etc/alternatives"):
            if entry.is_symlink():
                target = os.readlink(entry.path)
                if target.startswith(("/usr/", "/bin/", "/sbin/", "/lib")):
                    os.symlink(target, f"root/etc/alternatives/{entry.name}")


def _dev() -> None:
    """A minimal /dev: no disks, no kvm, no mem; what bubblewrap's `--dev` offers."""
    mounts.mount("tmpfs", "root/dev", "tmpfs", mounts.MS_NOSUID, SMALL)
    for name in DEVICES:
        if os.path.exists(f"/dev/{name}"):
            open(f"root/dev/{name}", "w").close()
            mounts.mount(f"/dev/{name}", f"root/dev/{name}", None, mounts.MS_BIND)
            mounts.mount(None, f"root/dev/{name}", None,
                         mounts.MS_REMOUNT | mounts.MS_BIND | mounts.MS_NOSUID)
    for name, target in DEV_LINKS.items():
        os.symlink(target, f"root/dev/{name}")
    os.mkdir("root/dev/pts", 0o755)
    mounts.mount("devpts", "root/dev/pts", "devpts", mounts.MS_NOSUID,
                 "newinstance,ptmxmode=0666,mode=620")
    os.mkdir("root/dev/shm", 0o755)
    _base("root/dev/shm")
    mounts.mount(None, "root/dev", None, mounts.MS_REMOUNT | mounts.MS_RDONLY | mounts.MS_NOSUID)
