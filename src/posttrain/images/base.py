"""Base images without a registry: `FROM debian|ubuntu|python:3.X` -> a root derived from the host.

Nothing is downloaded. A base is the host's userland seen through an image's eyes:

* the host's `/usr` (and `/var/lib/dpkg`, `/var/lib/apt`, `/var/cache/debconf`, so `dpkg` and
  `apt-get` know what is installed) as the bottom of nested overlays (`sandbox/imageroot.py`):
  readable and, through the overlay, writable inside; never written on the host;
* a generated *skeleton* layer for the rest: `/etc` from a short allow-list of the host's
  (apt, dpkg, loader, shells, skeleton files, PAM, `login.defs`, certificates; never
  `shadow`, keys, `pip.conf` or anything site-specific) plus a fresh `passwd`, `group`,
  `shadow` and `gshadow` with only the system accounts; empty `/root`, `/home`, `/var/log`,
  `/srv`, `/opt`; the `/bin`, `/lib*` links of a merged `/usr`; the mount points of the job
  server's interpreter under `/opt/posttrain`;
* for `python:3.X`: the project's interpreter (3.X must be its version) as a virtual
  environment at `/usr/local` (`/usr/local/bin/python3`, `pip`), whose site-packages start as
  the project's (pytest included); a `pip install` of something already there is satisfied
  offline, anything else needs the network builds do not have.

Every Debian or Ubuntu tag maps to the host's Debian release: the image records the mapping
(`Image.base_note`), and `tasks check` runs the oracle to show whether a task works on it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys

SKELETON_VERSION = "1"
HOST_LOWERS = ("/usr", "/var/lib/dpkg", "/var/lib/apt", "/var/cache/debconf")
ETC_ALLOW = ("alternatives", "apt", "dpkg", "ld.so.conf", "ld.so.conf.d", "ld.so.cache",
             "os-release", "debian_version", "bash.bashrc", "profile", "profile.d", "skel",
             "login.defs", "default", "shells", "environment", "inputrc", "mime.types",
             "ca-certificates.conf", "ssl", "python3", "python3.11", "python3.12", "localtime",
             "timezone", "adduser.conf", "deluser.conf", "pam.d", "pam.conf", "security",
             "gai.conf", "host.conf", "magic", "magic.mime", "protocols", "services",
             "ethertypes", "rpc", "networks", "xattr.conf", "nsswitch.conf", "issue",
             "debconf.conf", "ucf.conf", "locale.alias", "terminfo", "subuid", "subgid")
ETC_DENY = ("apt/auth.conf", "apt/auth.conf.d", "ssl/private")
PASSWD = """root:x:0:0:root:/root:/bin/bash
daemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin
bin:x:2:2:bin:/bin:/usr/sbin/nologin
sys:x:3:3:sys:/dev:/usr/sbin/nologin
sync:x:4:65534:sync:/bin:/bin/sync
games:x:5:60:games:/usr/games:/usr/sbin/nologin
man:x:6:12:man:/var/cache/man:/usr/sbin/nologin
lp:x:7:7:lp:/var/spool/lpd:/usr/sbin/nologin
mail:x:8:8:mail:/var/mail:/usr/sbin/nologin
news:x:9:9:news:/var/spool/news:/usr/sbin/nologin
www-data:x:33:33:www-data:/var/www:/usr/sbin/nologin
backup:x:34:34:backup:/var/backups:/usr/sbin/nologin
_apt:x:42:65534::/nonexistent:/usr/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin
"""
GROUPS = ("root:0", "daemon:1", "bin:2", "sys:3", "adm:4", "tty:5", "disk:6", "lp:7",
          "mail:8", "news:9", "man:12", "proxy:13", "kmem:15", "dialout:20", "cdrom:24",
          "sudo:27", "audio:29", "www-data:33", "backup:34", "shadow:42", "utmp:43",
          "video:44", "plugdev:46", "staff:50", "games:60", "users:100", "nogroup:65534")
DIRS = {"proc": 0o555, "dev": 0o755, "tmp": 0o1777, "root": 0o700, "home": 0o755, "srv": 0o755,
        "mnt": 0o755, "media": 0o755, "opt": 0o755, "run": 0o755, "run/lock": 0o1777,
        "usr": 0o755, "var": 0o755, "var/lib": 0o755, "var/log": 0o755, "var/tmp": 0o1777,
        "var/cache": 0o755, "var/mail": 0o2775, "var/spool": 0o755, "var/local": 0o755,
        "var/opt": 0o755, "var/backups": 0o755, "var/lib/misc": 0o755,
        "var/cache/apt/archives/partial": 0o755, "etc": 0o755}


class BaseImageError(ValueError):
    """A FROM this machine cannot provide; the message says what it can."""


def _host_release() -> tuple[str, str]:
    fields: dict[str, str] = {}
    try:
        with open("/etc/os-release") as f:
            for line in f:
                k, _, v = line.strip().partition("=")
                fields[k] = v.strip('"')
    except OSError:
        pass
    return fields.get("ID", "linux"), fields.get("VERSION_ID", "")


def resolve_base(ref: str) -> dict:
    """`FROM ref` -> {"kind": "host"|"python", "note": what it maps to}; BaseImageError else."""
    name, _, tag = ref.lower().partition(":")
    name = name.split("@")[0].removeprefix("docker.io/").removeprefix("library/")
    host_id, host_ver = _host_release()
    here = f"the host's {host_id} {host_ver}".strip()
    if name in ("debian", "ubuntu", "buildpack-deps"):
        return {"kind": "host", "note": f"{ref} -> {here} userland"}
    if name == "python":
        want = re.match(r"(\d+)\.(\d+)", tag or "")
        have = f"{sys.version_info.major}.{sys.version_info.minor}"
        if tag in ("", "latest", "3", "slim") or (want and want.group(0) == have) or \
                tag.startswith(("3-", "slim-", "bookworm", "bullseye")):
            return {"kind": "python", "note": f"{ref} -> {here} userland + Python {have} "
                                              f"(the project's interpreter) at /usr/local"}
        raise BaseImageError(f"FROM {ref}: this machine provides Python {have} only "
                             f"(python:{have}, python:{have}-slim, python:3)")
    raise BaseImageError(f"FROM {ref}: not a base posttrain can provide without a registry "
                         f"(it maps debian:*, ubuntu:* and python:{sys.version_info.major}."
                         f"{sys.version_info.minor}* onto the host's userland)")


def base_digest(kind: str) -> str:
    """What a base is made of: its kind, the host's release and installed packages, the
    interpreter; a layer built on it is cached under a chain of hashes starting here."""
    from posttrain.sandbox.bwrap import python_digest

    h = hashlib.sha256(json.dumps([SKELETON_VERSION, kind, _host_release(), python_digest()])
                       .encode())
    for path in ("/var/lib/dpkg/status",):
        try:
            with open(path, "rb") as f:
                h.update(hashlib.sha256(f.read()).digest())
        except OSError:
            pass
    return h.hexdigest()[:24]


def host_lowers() -> list[list[str]]:
    """(inside path, host path) of the host directories every base borrows (bottom layers)."""
    out = [[p, p] for p in HOST_LOWERS if os.path.isdir(p) and not os.path.islink(p)]
    for name in ("bin", "sbin", "lib", "lib64", "lib32", "libx32"):
        if os.path.isdir(f"/{name}") and not os.path.islink(f"/{name}"):
            out.append([f"/{name}", f"/{name}"])  # a host without merged /usr
    return out


def python_lowers() -> list[list[str]]:
    from posttrain.sandbox.bwrap import python_layout

    lay = python_layout()
    return [[f"/usr/local/lib/{lay['version']}/site-packages", lay["site"]]] if lay["site"] else []


def _copy_etc(dest: str) -> None:
    for name in ETC_ALLOW:
        src = f"/etc/{name}"
        if not os.path.lexists(src):
            continue
        if os.path.islink(src):
            os.symlink(os.readlink(src), f"{dest}/etc/{name}")
        elif os.path.isdir(src):
            shutil.copytree(src, f"{dest}/etc/{name}", symlinks=True, ignore_dangling_symlinks=True,
                            ignore=lambda d, names: [n for n in names if os.path.relpath(
                                os.path.join(d, n), "/etc") in ETC_DENY])
        elif os.path.isfile(src):
            shutil.copy2(src, f"{dest}/etc/{name}")


def make_skeleton(dest: str, kind: str) -> None:
    """Write the skeleton layer of a `kind` base into `dest` (a new directory, disk ids)."""
    from posttrain.sandbox.bwrap import python_layout

    os.mkdir(dest, 0o755)
    for d, mode in DIRS.items():
        os.makedirs(f"{dest}/{d}", exist_ok=True)
        os.chmod(f"{dest}/{d}", mode)
    for name in ("bin", "sbin", "lib", "lib64", "lib32", "libx32"):
        if os.path.islink(f"/{name}"):
            os.symlink(os.readlink(f"/{name}"), f"{dest}/{name}")
        elif os.path.isdir(f"/{name}"):
            os.mkdir(f"{dest}/{name}", 0o755)
    for inside, _ in host_lowers():
        os.makedirs(dest + inside, 0o755, exist_ok=True)
    _copy_etc(dest)
    files = {"passwd": PASSWD, "hostname": "sandbox\n", "resolv.conf": "",
             "hosts": "127.0.0.1\tlocalhost sandbox\n::1\tlocalhost\n",
             "group": "".join(f"{g}:x:{n}:\n" for g, n in (x.split(":") for x in GROUPS)),
             "shadow": "".join(f"{line.split(':')[0]}:*:19000:0:99999:7:::\n"
                               for line in PASSWD.splitlines()),
             "gshadow": "".join(f"{x.split(':')[0]}:*::\n" for x in GROUPS),
             "subuid": "", "subgid": ""}
    for name, text in files.items():
        with open(f"{dest}/etc/{name}", "w") as f:
            f.write(text)
    for name in ("shadow", "gshadow"):
        os.chmod(f"{dest}/etc/{name}", 0o640)
        os.chown(f"{dest}/etc/{name}", 0, 42)
    lay = python_layout()
    opt = f"{dest}/opt/posttrain"
    site = f"lib/{lay['version']}/site-packages"
    for d in ("inside", "python", "venv/bin", f"venv/{site}"):
        os.makedirs(f"{opt}/{d}", 0o755)
    python = os.path.join("/opt/posttrain/python" if lay["inside_base"] != "/usr" else "/usr",
                          lay["exe"])
    _venv(f"{opt}/venv", python, lay["full_version"])
    if kind == "python":
        os.makedirs(f"{dest}/usr/local/{site}", 0o755)
        _venv(f"{dest}/usr/local", python, lay["full_version"], pip=True)
    for dirpath, dirnames, filenames in os.walk(dest):
        for name in dirnames + filenames:
            os.chown(os.path.join(dirpath, name), 0, 0, follow_symlinks=False)
    for name in ("shadow", "gshadow"):
        os.chown(f"{dest}/etc/{name}", 0, 42)
    os.chown(dest, 0, 0)


def _venv(prefix: str, python: str, version: str, pip: bool = False) -> None:
    """A virtual environment at `prefix` whose interpreter is `python` (an inside path)."""
    os.makedirs(f"{prefix}/bin", 0o755, exist_ok=True)
    with open(f"{prefix}/pyvenv.cfg", "w") as f:
        f.write(f"home = {os.path.dirname(python)}\ninclude-system-site-packages = false\n"
                f"version = {version}\n")
    major_minor = "python" + ".".join(version.split(".")[:2])
    for name in ("python", "python3", major_minor):
        os.symlink(python, f"{prefix}/bin/{name}")
    if pip:
        for name in ("pip", "pip3"):
            path = f"{prefix}/bin/{name}"
            with open(path, "w") as f:
                f.write("#!/usr/local/bin/python3\n"
                        "import sys\nfrom pip._internal.cli.main import main\nsys.exit(main())\n")
            os.chmod(path, 0o755)
