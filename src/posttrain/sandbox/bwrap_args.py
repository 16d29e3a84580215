"""bubblewrap's command line for a sandbox: the options that build its namespaces, identity and
environment (`plain_args`, `image_args`) and the job server's argv (`server_argv`). Pure
functions of the sandbox's configuration; `bwrap_runner.py` passes the options on a pipe."""

from __future__ import annotations

import os

from posttrain.sandbox.base import clock_env
from posttrain.sandbox.bwrap import CANDIDATE_UID, CANDIDATE_UID_ENV, INSIDE_UID, WS
from posttrain.sandbox.rlimits import thread_env

DOCKER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
ROOT_CAPS = ("CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD",
             "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE",
             "CAP_KILL", "CAP_AUDIT_WRITE")
"""Docker's default capabilities (less NET_RAW and SYS_CHROOT, whose syscalls the seccomp list
denies or the empty network makes moot), held by an image sandbox's root inside its namespace"""
GRADER_CAPS = ("CAP_SETUID", "CAP_SETGID", "CAP_KILL", "CAP_CHOWN", "CAP_DAC_READ_SEARCH")
"""what the grader (uid 1000) of a two-uid sandbox holds inside its user namespace, and only
in its own process (the job server clears its inheritable set, so nothing it execs keeps one):
switch a child to the candidate uid, kill the candidate's processes, hand it directories,
read what the candidate wrote whatever its mode"""


NET_FILES = ("/etc/resolv.conf", "/etc/hosts")
"""what an image build step with the host's network sees of the host's configuration (as
Docker): `image["network"]`, set by `posttrain.images.build` only, shares the host's network
namespace instead of an empty one"""


def python_path(layout: dict) -> str:
    """The project's interpreter as a plain sandbox sees it."""
    return os.path.join(layout["inside_base"], layout["exe"])


def _libpath(layout: dict, inside_base: str) -> dict[str, str]:
    if layout["libdir"] and layout["libdir"].startswith(layout["base"]) and layout["base"] != "/usr":
        return {"LD_LIBRARY_PATH": inside_base + layout["libdir"][len(layout["base"]):]}
    return {}


def _setenv(env: dict[str, str]) -> list[str]:
    out: list[str] = []
    for k, v in env.items():
        out += ["--setenv", k, v]
    return out


AS_INIT = ("--as-pid-1",)
"""the command (the job server) is the pid namespace's pid 1, no bubblewrap reaper above it:
nothing inside can kill it (`inside/_forkserver.py`), so an episode's `kill -9 -1` costs no
restart of the server and of its preloads (~25 ms, ~120 ms with numpy and manifold3d)"""


def plain_args(layout: dict, mnt: str, clock: int | None, userns_fd: int | None = None,
               cpus: float = 1.0) -> list[str]:
    """A plain sandbox: every namespace unshared, uid 1000 inside, no capabilities, the tree
    `rootfs.py` built at `mnt`/root as `/`, the project's Python on PATH.

    With `userns_fd` (a two-uid sandbox): the user namespace made by the supervisor, which
    maps uid 1000 (the grader) and 1001 (candidates) to two host uids of their own, and the
    grader holds `GRADER_CAPS` in it; `CANDIDATE_UID_ENV` tells grading programs."""
    path = "/usr/local/bin:/usr/bin:/bin"
    path = ("/opt/venv/bin:" if layout["venv"] else os.path.dirname(python_path(layout)) + ":") + path
    if userns_fd is None:
        a = ["--unshare-all", "--unshare-user", "--disable-userns"]
    else:  # nested user namespaces are off in it (`idmap.user_namespace`)
        a = ["--userns", str(userns_fd), "--unshare-ipc", "--unshare-pid", "--unshare-net",
             "--unshare-uts", "--unshare-cgroup"]
    a += ["--uid", str(INSIDE_UID), "--gid", str(INSIDE_UID), "--hostname", "sandbox",
          "--die-with-parent", "--new-session", "--cap-drop", "ALL", "--clearenv", *AS_INIT]
    for cap in (GRADER_CAPS if userns_fd is not None else ()):
        a += ["--cap-add", cap]
    # the tree `rootfs.py` built; --dev-bind because its /dev holds device nodes
    # (every mount in it is nosuid already, and nodev where nothing needs devices)
    a += ["--dev-bind", f"{mnt}/root", "/", "--proc", "/proc", "--chdir", WS]
    env = {"PATH": path, "HOME": "/tmp", "TMPDIR": "/tmp", "LANG": "C.UTF-8",
           "USER": "sandbox", "PYTHONPATH": "/opt/posttrain/inside",
           "PYTHONDONTWRITEBYTECODE": "1", **clock_env(clock), **thread_env(cpus)}
    if userns_fd is not None:
        env[CANDIDATE_UID_ENV] = str(CANDIDATE_UID)
    env.update(_libpath(layout, "/opt/python"))
    return a + _setenv(env)


def image_args(image: dict, layout: dict, mnt: str, workdir: str, userns_fd: int,
               clock: int | None) -> list[str]:
    """An image sandbox: the user namespace `userns_fd` (uids 0..65535 inside, see
    `idmap.py`), the image's user, environment and working directory; root keeps Docker's
    default capabilities *inside* that namespace (none on the host: every one is checked
    against the namespace, whose ids are unprivileged host uids)."""
    uid, gid = image.get("uid", 0), image.get("gid", 0)
    # bubblewrap runs as root inside (the range's first uid: the supervisor may prlimit
    # it); another USER is taken by the job server through setpriv (`server_argv`), which
    # clears the capabilities with the switch
    network = bool(image.get("network"))  # an image build's RUN step asked for it
    if network and image.get("workspace"):
        raise ValueError("the host's network is for image build steps only, never for a "
                         "sandbox with a workspace (an episode)")
    a = ["--userns", str(userns_fd), "--unshare-ipc", "--unshare-pid",
         *([] if network else ["--unshare-net"]), "--unshare-uts", "--unshare-cgroup",
         "--uid", "0", "--gid", "0", "--hostname", "sandbox",
         "--die-with-parent", "--new-session", "--cap-drop", "ALL", "--clearenv", *AS_INIT]
    for cap in (ROOT_CAPS if uid == 0 and gid == 0 else ("CAP_SETUID", "CAP_SETGID")):
        a += ["--cap-add", cap]
    a += ["--dev-bind", f"{mnt}/root", "/", "--proc", "/proc", "--chdir", workdir]
    if network:  # the host's resolver files, read-only, over the root (`ImageRoot.commit`
        # drops the empty mount points bubblewrap may create for them: never in a layer)
        a += [arg for f in NET_FILES for arg in ("--ro-bind-try", f, f)]
    env = {"PATH": DOCKER_PATH, "HOME": image.get("home") or ("/root" if uid == 0 else "/"),
           "LANG": "C.UTF-8", **clock_env(clock), **image.get("env", {})}
    env.update(_libpath(layout, "/opt/posttrain/python"))
    return a + _setenv(env)


def server_argv(layout: dict, image: dict, fd: int, started_fd: int,
                preload: list[str]) -> list[str]:
    """The job server's command (`inside/_forkserver.py`), as the image's USER if it has one."""
    python = "/opt/venv/bin/python3" if layout["venv"] else python_path(layout)
    if image:  # the image's own python3 may be another one, or none
        python = ("/opt/posttrain/venv/bin/python3" if layout["venv"] else
                  os.path.join("/opt/posttrain/python", layout["exe"]))
        uid, gid = image.get("uid", 0), image.get("gid", 0)
        if uid or gid:
            return ["/usr/bin/setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups",
                    "--", python, "/opt/posttrain/inside/_forkserver.py", str(fd),
                    str(started_fd), ",".join(preload)]
    return [python, "/opt/posttrain/inside/_forkserver.py", str(fd), str(started_fd),
            ",".join(preload)]
