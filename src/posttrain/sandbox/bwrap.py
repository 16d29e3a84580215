"""The default backend: bubblewrap, driven by a root supervisor in a private mount namespace.

Each sandbox is one long-lived `bwrap` whose command is the job server
(`inside/_forkserver.py`); every command (`run`) and Python job (`run_python`) is a process the
server forks inside that sandbox, so a command costs a fork (+ exec), not a new set of
namespaces. What each layer protects against, and what it does not:

* **Namespaces** (`--unshare-all --unshare-user --disable-userns`): the sandbox has its own
  mount, pid, network, ipc, uts, cgroup and user namespaces. Host processes are invisible and
  unsignalable; the only network interface is an unconfigured `lo`, so no packet leaves the
  sandbox, not even to the host's 127.0.0.1 or its abstract Unix sockets; the hostname is the
  sandbox's own. `--disable-userns` closes nested user namespaces (a large kernel attack
  surface). Not covered: the kernel itself is shared; a kernel exploit escapes every layer here.
* **Filesystem** (assembled by the supervisor, `rootfs.py`, and bound as the sandbox's `/`): a
  read-only tmpfs root; `/usr` (and the `/bin`, `/lib` links) read-only; generated
  `/etc/passwd`, `/etc/group`, `/etc/hosts`, the loader cache and the `/etc/alternatives` links
  into `/usr` (awk, which, ...), no other host `/etc` (no `/etc/shadow`); a private `/proc`; a
  minimal, read-only `/dev` (no disks, no `kvm`, no `mem`) with a capped `/dev/shm`; the
  project's Python at neutral paths (`/opt/python`, `/opt/venv`, read-only) and
  `src/posttrain/sandbox/inside` at `/opt/posttrain/inside`; the repository, `/root` and `/home`
  are not there at all. The workspace (`/ws`), `/tmp` and `/dev/shm` are size-capped and reset
  to empty between episodes (`overlay.py`): a disk fill ends in ENOSPC. Not covered: what *is*
  bound (the interpreter, site-packages, `/usr`) is readable, and `/proc/cpuinfo`,
  `/proc/meminfo` and the device names of `/usr` and `/dev` describe the host.
* **What `/proc` shows of the host**: nothing of its paths, uids or pids. Mounts are made by
  root outside the sandbox and host directories are overlays with relative layer names, so
  `/proc/self/mountinfo` holds no host path and no host uid; bubblewrap reads its options from a
  pipe (`--args`), so `/proc/1/cmdline` is `bwrap --args N -- <the job server>`; bubblewrap
  starts inside the sandbox's cgroup (named by a random id), so `/proc/self/cgroup` reads `/`;
  the environment is the sandbox's own; uids are 1000 (and 65534 for what root owns).
* **Identity**: run as root, posttrain launches each sandbox as its own unused host uid (see
  `slots.py`) mapped to uid 1000 inside, with no capabilities (`--cap-drop ALL` and an empty
  bounding set) and `no_new_privs`: setuid binaries, `chown` and writes to `/proc/sys` fail.
  Not covered: the backend needs posttrain to run as root (it mounts the workspace and switches
  uids); as an ordinary user only the unisolated `process` backend is available.
* **Environment**: bubblewrap is started with an empty environment, so neither the command nor
  `/proc/1/environ` (bubblewrap's own pid 1) shows the launcher's variables; the command sees
  only PATH, HOME, LANG, TMPDIR, USER, PYTHONPATH and what the caller passes.
* **seccomp** (`seccomp.py`): a deny-list of syscalls (ptrace, process_vm_*, bpf, keyrings,
  mount, unshare, io_uring, ...). Not covered: it is a deny-list, not an allow-list.
* **Resources**: cgroups for memory, pids and CPU where the machine offers them (`cgroups.py`),
  rlimits always (`rlimits.py`; RLIMIT_CPU afresh for every command), a wall timeout, output
  caps. On a timeout the supervisor kills the command's session through the cgroup (or, where
  there is none, the whole sandbox, job server included). What a command leaves running in the
  background (`server &`) keeps running, as in a shell, until `kill_processes()`, a `restore()`
  or the sandbox's end (or its reset between episodes), when everything in it is killed. The
  sandbox's pid 1 reaps inside; the supervisor is a subreaper and reaps outside: no zombie or
  orphan outlives the sandbox.
  Not covered: processes of one sandbox share its uid, so a command can kill the job server
  (the supervisor then starts a new one and says so in the result). A grading sandbox
  (`open_sandbox(two_uids=True)`) is the exception: a user namespace made by the supervisor
  maps uid 1000 and 1001 to two host uids, and what its grader starts as 1001 cannot signal
  or write anything of 1000's (`bwrap_args.plain_args`, `verifiers/grading.py`).
* **Lifetime**: `--die-with-parent` and `--new-session` (no terminal injection through TIOCSTI);
  the supervisor exits when the host's socket closes, and everything dies with it.

Snapshots: overlayfs layers on the supervisor's tmpfs, stacked so that a restore propagates
into the running sandbox (see `overlay.py`). A snapshot never changes after it is taken.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig

INSIDE_UID = 1000
CANDIDATE_UID = 1001
"""in a two-uid (grading) sandbox, the uid of candidate programs a grader starts (see
`bwrap_args.two_uid_args`); the grader is INSIDE_UID"""
CANDIDATE_UID_ENV = "POSTTRAIN_CANDIDATE_UID"
"""set in a two-uid sandbox's environment to CANDIDATE_UID: how a grading program knows"""
WS = "/ws"
RUN_DIR = "/run/posttrain"
MOUNTPOINT = (f"{RUN_DIR}/sandbox-mnt" if os.access("/run", os.W_OK)
              else "/tmp/posttrain-sandbox-mnt")
"""an always-empty host directory; each supervisor mounts its own tmpfs on it, privately. Not
under /tmp where possible: removing this directory on the host (a /tmp cleaner) detaches the
mounts of every live sandbox (Linux lazily unmounts mounts whose mountpoint is deleted)."""
INSTALL_HINT = ("install it with `apt-get install bubblewrap` (Debian/Ubuntu; "
                "`dnf install bubblewrap` on Fedora)")
PR_SET_CHILD_SUBREAPER = 36


# -- host-side facts (computed once per process) ------------------------------------------
def find_bwrap() -> str | None:
    return shutil.which("bwrap") or ("/usr/bin/bwrap" if os.path.exists("/usr/bin/bwrap") else None)


@functools.lru_cache(maxsize=1)
def bwrap_problem() -> str | None:
    """None if the bubblewrap backend can run here, else a sentence saying why not."""
    path = find_bwrap()
    if path is None:
        return f"bubblewrap (bwrap) is not installed: {INSTALL_HINT}"
    if os.geteuid() != 0:
        return ("the bubblewrap backend needs to run as root (it mounts each workspace overlay "
                "in a private mount namespace and runs each sandbox as its own uid)")
    probe = [path, "--unshare-all", "--unshare-user", "--disable-userns", "--ro-bind", "/usr",
             "/usr", *_root_links(), "--", "/usr/bin/true"]
    try:
        p = subprocess.run(probe, user=65534, group=65534, extra_groups=[], env={},
                           capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as e:
        return f"bubblewrap cannot start here ({e!r}); {INSTALL_HINT}"
    if p.returncode != 0:
        return ("bubblewrap cannot create a sandbox here (are unprivileged user namespaces "
                "enabled? sysctl user.max_user_namespaces / kernel.unprivileged_userns_clone): "
                + p.stderr.decode(errors="replace").strip())
    return None


def _root_links() -> list[str]:
    """/bin, /sbin, /lib* as on the host: symlinks into /usr (merged /usr) or read-only binds."""
    out: list[str] = []
    for name in ("bin", "sbin", "lib", "lib64", "lib32", "libx32"):
        host = f"/{name}"
        if os.path.islink(host):
            out += ["--symlink", os.readlink(host), host]
        elif os.path.isdir(host):
            out += ["--ro-bind", host, host]
    return out


@functools.lru_cache(maxsize=1)
def python_layout() -> dict:
    """Where the project's interpreter is on the host, and where it goes in the sandbox."""
    base = os.path.realpath(sys.base_prefix)
    exe = os.path.realpath(sys.executable)
    if not exe.startswith(base + "/"):
        raise RuntimeError(f"the interpreter {exe} is not under sys.base_prefix {base}")
    ver = f"python{sys.version_info.major}.{sys.version_info.minor}"
    inside_base = base if base == "/usr" else "/opt/python"
    venv = os.path.realpath(sys.prefix) != base
    site = os.path.realpath(sysconfig.get_paths()["purelib"]) if venv else None
    shared = sysconfig.get_config_var("Py_ENABLE_SHARED")
    libdir = sysconfig.get_config_var("LIBDIR") if shared else None
    return {
        "base": base, "inside_base": inside_base, "exe": os.path.relpath(exe, base),
        "version": ver, "full_version": sys.version.split()[0], "venv": venv, "site": site,
        "libdir": (os.path.realpath(libdir) if libdir else None),
    }


@functools.lru_cache(maxsize=1)
def seccomp_program() -> bytes | None:
    from posttrain.sandbox.seccomp import SeccompUnavailable, build_bpf

    try:
        return build_bpf()
    except SeccompUnavailable:
        return None


@functools.lru_cache(maxsize=1)
def python_digest() -> str:
    """A hash of the interpreter and its installed distributions (name-version)."""
    lay = python_layout()
    dists = sorted(os.listdir(lay["site"])) if lay["site"] else []
    blob = json.dumps([lay["full_version"], lay["exe"], [d for d in dists if d.endswith(
        (".dist-info", ".egg-info"))]])
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


@functools.lru_cache(maxsize=8)
def image_digest(inside: str) -> str:
    """A hash of what a sandbox sees: bubblewrap version, root layout, interpreter, packages,
    the files it is shown at /opt/posttrain/inside (`inside`, see `insidedir`). Recorded in
    trajectories (`SandboxInfo.image`)."""
    h = hashlib.sha256()
    try:
        h.update(subprocess.run([find_bwrap() or "bwrap", "--version"], capture_output=True,
                                timeout=10).stdout)
    except (OSError, subprocess.SubprocessError):
        pass
    h.update(json.dumps([_root_links(), python_digest(), seccomp_program() is not None]).encode())
    for name in sorted(os.listdir(inside)):
        path = os.path.join(inside, name)
        if os.path.isfile(path):
            h.update(name.encode())
            with open(path, "rb") as f:
                h.update(hashlib.sha256(f.read()).digest())
    return "bwrap:" + h.hexdigest()[:16]


def host_config() -> dict:
    """What the host passes to a bubblewrap supervisor (see `BwrapRunner`)."""
    return {"bwrap": find_bwrap(), "layout": python_layout(), "seccomp": seccomp_program(),
            "root_links": _root_links(), "mountpoint": MOUNTPOINT}
