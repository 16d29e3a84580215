"""Supervisor-side half of the bubblewrap backend (see `bwrap.py` for the design and the
layers). Runs as root in the supervisor's private mount namespace."""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess

from posttrain.sandbox import mounts
from posttrain.sandbox.base import Limits
from posttrain.sandbox.bwrap import INSIDE_UID, PR_SET_CHILD_SUBREAPER, WS
from posttrain.sandbox.cgroups import SandboxCgroup, collect_stale, detect
from posttrain.sandbox.rlimits import apply_self, rlimit_table

MAX_LAYERS = 400
"""an overlay mount takes at most ~500 lower layers (and one page of options)"""
# bubblewrap exits with 128+N when its command died of signal N; these are read as signals
_DEATH_SIGNALS = {signal.SIGILL, signal.SIGABRT, signal.SIGBUS, signal.SIGFPE, signal.SIGKILL,
                  signal.SIGSEGV, signal.SIGPIPE, signal.SIGTERM, signal.SIGXCPU,
                  signal.SIGXFSZ, signal.SIGSYS}
PASSWD = ("root:x:0:0:root:/root:/usr/sbin/nologin\n"
          f"sandbox:x:{INSIDE_UID}:{INSIDE_UID}:sandbox:/tmp:/bin/sh\n"
          "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n")
GROUP = f"root:x:0:\nsandbox:x:{INSIDE_UID}:\nnogroup:x:65534:\n"
HOSTS = "127.0.0.1\tlocalhost sandbox\n::1\tlocalhost\n"


class BwrapHandle:
    """One bubblewrap process tree. Killing the outer bwrap kills its pid 1
    (--die-with-parent), and the death of a pid namespace's pid 1 kills everything in it."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        self.pid = proc.pid
        self.pidfd = os.pidfd_open(proc.pid)

    def kill(self, job_pid: int | None = None) -> None:
        # job_pid is a pid inside the sandbox's namespace: meaningless here, never signalled
        try:
            signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
        except OSError:
            pass

    @staticmethod
    def exit_status(status: int) -> tuple[int | None, int | None]:
        code = os.waitstatus_to_exitcode(status)
        if code < 0:
            return None, -code
        if code > 128 and (code - 128) in _DEATH_SIGNALS:
            return None, code - 128
        return code, None

    def close(self) -> None:
        os.close(self.pidfd)
        self.proc.returncode = 0  # reaped by the supervisor (os.wait4); Popen must not wait


class BwrapRunner:
    kind = "bwrap"

    def __init__(self, cfg: dict) -> None:
        self.cfg = cfg
        self.limits = Limits(**cfg["limits"])
        self.uid = cfg["uid"] if cfg["uid"] is not None else os.getuid()
        self.layout = cfg["layout"]
        self.seccomp: bytes | None = cfg["seccomp"]
        self.mnt = cfg["mountpoint"]
        self.inside_ws = WS
        self.snapshots: dict[str, list[str]] = {}
        self.frozen: set[str] = set()
        self.trash: list[str] = []
        self.upper = ""
        self.lowers: list[str] = []
        self.count = 0
        self.cg: SandboxCgroup | None = None
        cg = detect()
        self.rlimits = rlimit_table(self.limits, memory_cgroup="memory" in cg)
        self.warm_rlimits = rlimit_table(self.limits, memory_cgroup="memory" in cg, cpu=False)

    # -- boot ----------------------------------------------------------------------------
    def boot(self) -> dict:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)  # orphans come to us, and are reaped
        collect_stale()
        if os.path.islink(self.mnt):
            raise RuntimeError(f"{self.mnt} is a symlink; refusing to mount on it")
        os.makedirs(self.mnt, mode=0o755, exist_ok=True)
        mounts.unshare_mount_namespace()
        mounts.mount("tmpfs", self.mnt, "tmpfs", mounts.MS_NOSUID | mounts.MS_NODEV,
                     f"size={self.limits.workspace_mb}m,mode=0755")
        os.chdir(self.mnt)  # overlay layer paths below are relative to it (short options)
        for d in ("h", "l", "l/0", "u", "w", "etc", "opt", "opt/posttrain",
                  "opt/posttrain/inside"):
            os.mkdir(d, 0o755)
        for name, text in (("passwd", PASSWD), ("group", GROUP), ("hosts", HOSTS)):
            with open(f"etc/{name}", "w") as f:
                f.write(text)
        if os.path.exists("/etc/ld.so.cache"):
            shutil.copyfile("/etc/ld.so.cache", "etc/ld.so.cache")
        # Everything under /opt (interpreter, venv layout, helper libraries) is assembled here
        # and bound with ONE read-only bind: bubblewrap's cost grows with the number of binds.
        lay = self.layout
        if lay["inside_base"] != lay["base"]:
            os.mkdir("opt/python", 0o755)
            mounts.bind(lay["base"], "opt/python", readonly=True)
        if lay["venv"]:
            site = f"opt/venv/lib/{lay['version']}/site-packages"
            os.makedirs(site, 0o755)
            os.mkdir("opt/venv/bin", 0o755)
            mounts.bind(lay["site"], site, readonly=True)
            with open("opt/venv/pyvenv.cfg", "w") as f:
                f.write(f"home = {os.path.dirname(self._python())}\n"
                        "include-system-site-packages = false\n"
                        f"version = {lay['full_version']}\n")
            for name in ("python", "python3", lay["version"]):
                os.symlink(self._python(), f"opt/venv/bin/{name}")
        mounts.bind(self.cfg["inside_dir"], "opt/posttrain/inside", readonly=True)
        mounts.bind("h", "h")
        mounts.mount(None, "h", None, mounts.MS_SHARED)  # so later overlays propagate inside
        self._mount_overlay(["l/0"])
        if detect():
            self.cg = SandboxCgroup(f"{os.getpid()}-{self.cfg['id']}", self.limits)
        self.argv = self._static_argv()
        mounts.drop_bounding_set()
        layers = {"cgroup-" + c: c in (self.cg.dirs if self.cg else {}) for c in
                  ("memory", "pids", "cpu")}
        layers["seccomp"] = self.seccomp is not None
        return {"workspace": f"{self.mnt}/h", "inside_path": WS, "layers": layers}

    def _python(self) -> str:
        lay = self.layout
        return os.path.join(lay["inside_base"], lay["exe"])

    def _static_argv(self) -> list[str]:
        lay, m = self.layout, self.mnt
        path = "/usr/local/bin:/usr/bin:/bin"
        path = ("/opt/venv/bin:" if lay["venv"] else os.path.dirname(self._python()) + ":") + path
        a = [self.cfg["bwrap"], "--unshare-all", "--unshare-user", "--disable-userns",
             "--uid", str(INSIDE_UID), "--gid", str(INSIDE_UID), "--hostname", "sandbox",
             "--die-with-parent", "--new-session", "--cap-drop", "ALL", "--clearenv",
             "--ro-bind", "/usr", "/usr", *self.cfg["root_links"],
             "--ro-bind", f"{m}/etc", "/etc", "--ro-bind", f"{m}/opt", "/opt",
             "--proc", "/proc", "--dev", "/dev",
             "--size", str(self.limits.workspace_mb << 20), "--tmpfs", "/tmp",
             "--bind", f"{m}/h", WS, "--chdir", WS]
        env = {"PATH": path, "HOME": "/tmp", "TMPDIR": "/tmp", "LANG": "C.UTF-8",
               "USER": "sandbox", "PYTHONPATH": "/opt/posttrain/inside",
               "PYTHONDONTWRITEBYTECODE": "1"}
        if lay["libdir"] and lay["libdir"].startswith(lay["base"]) and lay["base"] != "/usr":
            env["LD_LIBRARY_PATH"] = lay["inside_base"] + lay["libdir"][len(lay["base"]):]
        for k, v in env.items():
            a += ["--setenv", k, v]
        return a

    # -- processes -----------------------------------------------------------------------
    def spawn(self, argv: list[str], *, stdin: int, stdout: int, stderr: int,
              env: dict[str, str] | None = None, pass_fds: tuple[int, ...] = (),
              warm: bool = False) -> BwrapHandle:
        full = list(self.argv)
        fds = list(pass_fds)
        sec_r = None
        if self.seccomp is not None:
            sec_r, sec_w = os.pipe2(os.O_CLOEXEC)
            os.write(sec_w, self.seccomp)  # a few hundred bytes: fits in the pipe buffer
            os.close(sec_w)
            full += ["--seccomp", str(sec_r)]
            fds.append(sec_r)
        for k, v in (env or {}).items():
            full += ["--setenv", k, v]
        full += ["--remount-ro", "/", "--", *argv]
        table = self.warm_rlimits if warm else self.rlimits
        procs = [f"{d}/cgroup.procs" for d in sorted(set(self.cg.dirs.values()))] if self.cg else []
        uid = self.uid

        def enter_sandbox_identity() -> None:
            # In the child between fork and exec (safe: the supervisor is single-threaded).
            # The cgroup is joined *before* exec, so not one instruction of bwrap or of the
            # command runs outside it; then the rlimits, then the unprivileged uid.
            pid = str(os.getpid())
            for p in procs:
                with open(p, "w") as f:
                    f.write(pid)
            apply_self(table)
            if os.getuid() == 0:
                os.setgroups([])
                os.setresgid(uid, uid, uid)
                os.setresuid(uid, uid, uid)

        try:
            proc = subprocess.Popen(full, stdin=stdin, stdout=stdout, stderr=stderr,
                                    pass_fds=tuple(fds), env={}, cwd="/",
                                    preexec_fn=enter_sandbox_identity)
        finally:
            if sec_r is not None:
                os.close(sec_r)
        return BwrapHandle(proc)

    def warm_argv(self, fd: int, preload: list[str]) -> list[str]:
        python = "/opt/venv/bin/python3" if self.layout["venv"] else self._python()
        return [python, "/opt/posttrain/inside/_forkserver.py", str(fd), ",".join(preload),
                "sweep"]

    def counters(self) -> dict[str, int]:
        return self.cg.counters() if self.cg else {}

    def reset_peak(self) -> None:
        if self.cg:
            self.cg.reset_peak()

    def peak_mb(self) -> float | None:
        return self.cg.peak_mb() if self.cg else None

    # -- snapshots -----------------------------------------------------------------------
    def _mount_overlay(self, lowers: list[str]) -> None:
        if len(lowers) > MAX_LAYERS:
            raise RuntimeError(f"too many snapshot layers ({len(lowers)} > {MAX_LAYERS})")
        self.count += 1
        upper, work = f"u/{self.count}", f"w/{self.count}"
        os.mkdir(upper, 0o755)
        os.mkdir(work, 0o700)
        os.chown(upper, self.uid, self.uid)
        # stacked on the current overlay (never unmounted): see the module docstring
        mounts.mount("overlay", "h", "overlay", mounts.MS_NOSUID | mounts.MS_NODEV,
                     f"lowerdir={':'.join(lowers)},upperdir={upper},workdir={work}")
        self.upper, self.lowers = upper, lowers

    def snapshot(self) -> str:
        sid = f"snap-{len(self.snapshots) + 1}"
        frozen = [self.upper] + self.lowers
        self.frozen.add(self.upper)
        self._mount_overlay(frozen)
        self.snapshots[sid] = frozen
        return sid

    def restore(self, sid: str) -> None:
        old = self.upper
        self._mount_overlay(self.snapshots[sid])
        if old not in self.frozen:
            self.trash.append(old)

    def idle(self) -> None:
        """Work done after a reply was sent: free discarded layers, reap orphans."""
        while self.trash:
            path = self.trash.pop()
            shutil.rmtree(path, ignore_errors=True)
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break

    def shutdown(self) -> None:
        if self.cg is not None:
            self.cg.destroy()
