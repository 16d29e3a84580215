"""The `process` backend: plain subprocesses with rlimits and a temporary-directory workspace.

This is NOT a sandbox. It exists for machines without bubblewrap (macOS CI, a laptop) and for
trusted code only. It protects against accidents, not against an adversary:

* it does: rlimits (address space, CPU, file size, open files, no core dumps), a wall timeout
  that kills the command's process group, output caps, a cleared environment, a private
  working directory, the same fork-server warm path;
* it does not: hide any host file (the command can read whatever the invoking user can, e.g.
  `~/.ssh`), block the network, or cap the workspace size; run as root, the command is root.
  Leftover processes are found as descendants of the supervisor (a subreaper), which a
  determined program can escape.

`open_sandbox` therefore refuses it unless the caller opts in (`allow_unsandboxed=True` or
`POSTTRAIN_ALLOW_UNSANDBOXED=1`) and warns loudly when it is used.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import stat
import subprocess
import tempfile
import time

from posttrain.sandbox.base import Limits, clock_env
from posttrain.sandbox.reset import PlaceState, ResetFacts
from posttrain.sandbox.rlimits import apply_self, rlimit_table, thread_env

PR_SET_CHILD_SUBREAPER = 36


def _count_own_processes() -> int:
    uid, n = os.getuid(), 0
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.stat(f"/proc/{name}").st_uid == uid:
                    n += 1
            except OSError:
                pass
    return n


def _special(directory: str, names: list[str]) -> list[str]:
    """FIFOs, sockets and device nodes: not workspace content (copying a FIFO would block)."""
    out = []
    for name in names:
        mode = os.lstat(os.path.join(directory, name)).st_mode
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode)):
            out.append(name)
    return out


class ProcessHandle:
    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        self.pid = proc.pid
        self.pidfd = os.pidfd_open(proc.pid)

    def kill(self) -> None:
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except OSError:
            pass

    def close(self) -> None:
        os.close(self.pidfd)
        self.proc.returncode = 0  # reaped by the supervisor; Popen must not wait again


class ProcessRunner:
    """Supervisor-side half of the process backend (see the module docstring)."""

    kind = "process"

    def __init__(self, cfg: dict) -> None:
        self.cfg = cfg
        self.limits = Limits(**cfg["limits"])
        self.base = tempfile.mkdtemp(prefix="posttrain-sandbox-")
        self.ws = os.path.join(self.base, "ws")
        self.inside_ws = self.ws
        os.mkdir(self.ws, 0o755)
        os.mkdir(os.path.join(self.base, "tmp"), 0o700)
        os.mkdir(os.path.join(self.base, "snaps"), 0o700)
        self.snapshots: dict[str, str] = {}
        # NPROC counts every process of the uid, not just this sandbox's: allow for those
        slack = 8 if os.getuid() == 0 else 8 + _count_own_processes()
        # the job server sets RLIMIT_CPU for each job itself
        self.rlimits = rlimit_table(self.limits, memory_cgroup=False, nproc_slack=slack,
                                    cpu=False)
        self.tmp = os.path.join(self.base, "tmp")
        self.env = {
            "PATH": f"{os.path.dirname(cfg['python'])}:/usr/local/bin:/usr/bin:/bin",
            "HOME": self.tmp,
            "TMPDIR": self.tmp,
            "LANG": "C.UTF-8",
            "PYTHONPATH": cfg["inside_dir"],
            "PYTHONDONTWRITEBYTECODE": "1",
            **clock_env(cfg.get("clock")),
            **thread_env(self.limits.cpus),
        }
        self.next_id = 1
        self.trash: list[str] = []

    def boot(self) -> dict:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)  # orphans come to us: found, reaped
        return {"workspace": self.ws, "inside_path": self.ws, "cgroups": {}, "layers": {},
                "cleanup_dir": self.base}

    # -- processes -----------------------------------------------------------------------
    def spawn(self, argv: list[str], *, stdin: int, stdout: int, stderr: int,
              pass_fds: tuple[int, ...] = ()) -> ProcessHandle:
        table = self.rlimits
        # preexec_fn is safe here: the supervisor is single-threaded
        proc = subprocess.Popen(argv, stdin=stdin, stdout=stdout, stderr=stderr,
                                cwd=self.ws, env=self.env, pass_fds=pass_fds,
                                start_new_session=True, preexec_fn=lambda: apply_self(table))
        return ProcessHandle(proc)

    def server_argv(self, fd: int, started_fd: int, preload: list[str]) -> list[str]:
        return [self.cfg["python"], os.path.join(self.cfg["inside_dir"], "_forkserver.py"),
                str(fd), str(started_fd), ",".join(preload)]

    def server_ready(self, handle: ProcessHandle) -> None:
        pass

    def kill_job(self, handle: ProcessHandle, job_pid: int | None) -> bool:
        """The job is its own process group (it calls setsid): kill that group."""
        if not job_pid:
            return False
        try:
            os.killpg(job_pid, signal.SIGKILL)
        except OSError:
            pass
        return True

    def _leftovers(self, server_pid: int | None) -> list[int]:
        """Descendants of the supervisor (a subreaper: orphans come to it) except the job
        server and what runs under it."""
        out, todo = [], [os.getpid()]
        while todo:
            pid = todo.pop()
            try:
                with open(f"/proc/{pid}/task/{pid}/children") as f:
                    children = [int(x) for x in f.read().split()]
            except (OSError, ValueError):
                continue
            for child in children:
                if child != server_pid:
                    out.append(child)
                    todo.append(child)
        return out

    def kill_processes(self, handle: ProcessHandle | None) -> int | None:
        """SIGKILL the leftovers until none is left (a SIGKILLed process takes a moment to die
        and be reaped, and its own children come to us meanwhile); the number of processes
        killed, or None if they do not settle."""
        killed: set[int] = set()
        for _ in range(500):
            victims = self._leftovers(handle.pid if handle else None)
            if not victims:
                return len(killed)
            for pid in victims:
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed.add(pid)
                except OSError:
                    pass
            self.idle()
            time.sleep(0.001)
        return None

    def idle(self) -> None:
        while self.trash:
            shutil.rmtree(self.trash.pop(), ignore_errors=True)
        while True:  # reap the orphans we inherited as a subreaper
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return

    def counters(self) -> dict[str, int]:
        return {}

    def reset_peak(self) -> None:
        pass

    def peak_mb(self) -> float | None:
        return None

    # -- snapshots: full copies (O(files)); never changed by later writes --------------------
    def snapshot(self) -> str:
        sid = f"snap-{self.next_id}"
        self.next_id += 1
        dst = os.path.join(self.base, "snaps", sid)
        shutil.copytree(self.ws, dst, symlinks=True, ignore=_special)
        self.snapshots[sid] = dst
        return sid

    def restore(self, sid: str) -> None:
        src = self.snapshots[sid]
        trash = tempfile.mkdtemp(dir=self.base, prefix="trash-")
        os.rename(self.ws, os.path.join(trash, "ws"))
        shutil.copytree(src, self.ws, symlinks=True, ignore=_special)
        shutil.rmtree(trash, ignore_errors=True)

    # -- reset between episodes (`reset.py` decides) --------------------------------------
    def reset(self, server: ProcessHandle | None, start_server=None) -> ResetFacts:
        """Kill the leftovers, replace the workspace and the temporary directory ($HOME) with
        empty ones, drop the snapshots. The host's /dev/shm is not the sandbox's to reset (this
        backend isolates nothing), nor is System V IPC. A killed job server is not restarted
        (`start_server` unused): without a pid namespace nothing ended with it, so the sandbox
        is refused."""
        if server is None:
            return ResetFacts(killed=0, server="not running (killed during the episode?)")
        killed = self.kill_processes(server)
        if killed is None:
            return ResetFacts(killed=None)
        try:
            for d in (self.ws, self.tmp):
                gone = tempfile.mkdtemp(dir=self.base, prefix="trash-")
                os.rename(d, os.path.join(gone, "x"))
                self.trash.append(gone)
                os.mkdir(d, 0o755 if d == self.ws else 0o700)
            self.trash += list(self.snapshots.values())
            self.snapshots.clear()
        except OSError as e:
            return ResetFacts(killed=killed, restore_error=str(e))
        places = []
        for d, name, mode in ((self.ws, "/ws", 0o755), (self.tmp, "/tmp", 0o700)):
            st = os.stat(d)
            places.append(PlaceState(name, tuple(os.listdir(d)), st.st_uid == os.getuid(),
                                     stat.S_IMODE(st.st_mode), 0, expected_mode=mode))
        return ResetFacts(killed=killed, places=tuple(places), expected_mounts=0)

    def shutdown(self) -> bool:
        self.kill_processes(None)
        shutil.rmtree(self.base, ignore_errors=True)
        return False  # a daemon that double-forked away from us may still run
