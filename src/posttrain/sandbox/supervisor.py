"""The per-sandbox supervisor: a small process outside the sandbox that runs its commands.

The host starts one supervisor per sandbox (`python -I -S supervisor.py FD`) and talks to it over
a Unix socket (pickled requests, see `protocol.py`). The supervisor is single-threaded, owns the
sandbox's mounts (bubblewrap backend: in a private mount namespace) and cgroup, launches every
command, enforces the wall timeout and the output caps (`execute.pump`), keeps the warm-path
fork-server, and turns what happened into a `RunResult` dict. When the host's end of the socket
closes (the host exited or was killed), the supervisor kills everything and exits: nothing of a
sandbox outlives its host.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
import traceback

if __name__ == "__main__":  # started as a script with -I -S: make `posttrain` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from posttrain.sandbox.base import Limits, LimitReason  # noqa: E402
from posttrain.sandbox.execute import pump  # noqa: E402
from posttrain.sandbox.protocol import recv_json, recv_obj, send_json, send_obj  # noqa: E402

WARM_BOOT_TIMEOUT_S = 120.0
"""how long the fork-server may take to import its preloads before the sandbox is broken"""


class WarmServer:
    """The fork-server of one sandbox: started at boot, restarted after a job killed it."""

    def __init__(self, runner, preload: list[str]) -> None:
        self.runner = runner
        self.preload = preload
        self.handle = None
        self.sock: socket.socket | None = None
        self.ready = False
        self.job_pid: int | None = None
        """the running job's pid, as the fork-server sees it (the process backend kills its
        process group on a timeout; in a pid namespace the whole namespace goes instead)"""

    def start(self) -> None:
        ours, theirs = socket.socketpair()
        with open(os.devnull, "r+b") as null:
            self.handle = self.runner.spawn(
                self.runner.warm_argv(theirs.fileno(), self.preload), stdin=null.fileno(),
                stdout=null.fileno(), stderr=null.fileno(), pass_fds=(theirs.fileno(),),
                warm=True)
        theirs.close()
        self.sock, self.ready = ours, False

    def ensure(self) -> None:
        if self.handle is None:
            self.start()
        if not self.ready:
            self.sock.settimeout(WARM_BOOT_TIMEOUT_S)
            try:
                msg, _ = recv_json(self.sock)
            except (EOFError, OSError, ValueError) as e:
                self.kill()
                raise RuntimeError(f"the fork-server did not start: {e!r}") from None
            finally:
                if self.sock is not None:
                    self.sock.settimeout(None)
            if not (isinstance(msg, dict) and msg.get("ready") is True):
                self.kill()
                raise RuntimeError("the fork-server sent a malformed greeting")
            if msg.get("errors"):
                errors = msg["errors"]
                self.kill()
                raise RuntimeError("preload failed inside the sandbox: "
                                   + "; ".join(f"{k}: {v}" for k, v in errors.items()))
            self.ready = True

    def kill(self) -> None:
        if self.handle is not None:
            self.handle.kill(job_pid=self.job_pid)
            try:
                os.waitpid(self.handle.pid, 0)
            except ChildProcessError:
                pass
            self.handle.close()
        if self.sock is not None:
            self.sock.close()
        self.handle, self.sock, self.ready = None, None, False


def _pipes(stdin: bytes | None):
    out_r, out_w = os.pipe2(os.O_CLOEXEC)
    err_r, err_w = os.pipe2(os.O_CLOEXEC)
    if stdin is not None:
        in_r, in_w = os.pipe2(os.O_CLOEXEC)
    else:
        in_r, in_w = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC), None
    return (in_r, out_w, err_w), (in_w, out_r, err_r)


class Supervisor:
    def __init__(self, cfg: dict, host: socket.socket) -> None:
        self.cfg = cfg
        self.host = host
        self.limits = Limits(**cfg["limits"])
        if cfg["mode"] == "bwrap":
            from posttrain.sandbox.bwrap_runner import BwrapRunner
            self.runner = BwrapRunner(cfg)
        else:
            from posttrain.sandbox.process import ProcessRunner
            self.runner = ProcessRunner(cfg)
        self.warm = WarmServer(self.runner, list(cfg.get("preload", ())))

    def boot(self) -> dict:
        info = self.runner.boot()
        self.warm.start()  # imports its preloads while the host does other things
        return {"pid": os.getpid(), **info}

    # -- requests ------------------------------------------------------------------------
    def handle(self, req: dict) -> dict:
        op = req["op"]
        if op == "run":
            return self.run(req)
        if op == "run_python":
            return self.run_python(req)
        if op == "snapshot":
            return {"id": self.runner.snapshot()}
        if op == "restore":
            if req["id"] not in self.runner.snapshots:
                raise KeyError(f"unknown snapshot id {req['id']!r}")
            self.runner.restore(req["id"])
            return {}
        if op == "ping":
            return {}
        raise ValueError(f"unknown request {op!r}")

    def run(self, req: dict) -> dict:
        child, ours = _pipes(req.get("stdin"))
        before = self.runner.counters()
        self.runner.reset_peak()
        try:
            handle = self.runner.spawn(req["argv"], stdin=child[0], stdout=child[1],
                                       stderr=child[2], env=req.get("env"))
        except OSError as e:  # process backend: the binary is missing or not executable
            for fd in ours:
                if fd is not None:
                    os.close(fd)
            return self._not_executed(req["argv"][0], e)
        finally:
            for fd in child:
                os.close(fd)
        pidfd = handle.pidfd
        status: dict = {}

        def on_done() -> bool:
            pid, st, ru = os.wait4(handle.pid, os.WNOHANG)
            if pid == 0:
                return False
            status.update(status=st, cpu_s=ru.ru_utime + ru.ru_stime, maxrss_kb=ru.ru_maxrss)
            return True

        try:
            cap = pump(out_fd=ours[1], err_fd=ours[2], stdin_fd=ours[0],
                       stdin_data=req.get("stdin"), done_fd=pidfd, on_done=on_done,
                       kill=handle.kill, timeout=req["timeout"], limits=self.limits,
                       hangup_fd=self.host.fileno())
        finally:
            handle.kill()  # whatever the command left behind (process group / pid namespace)
            handle.close()
            for fd in ours[1:]:
                os.close(fd)
        exit_code, sig = handle.exit_status(status["status"])
        if self.runner.kind == "bwrap" and exit_code == 1 and cap.err.startswith(b"bwrap: execvp "):
            exit_code = 127  # bubblewrap could not exec the command: say so like a shell would
            cap.err[:0] = b"posttrain: command not found or not executable in the sandbox\n"
        return self._result(cap, exit_code, sig, status, before)

    def _not_executed(self, name: str, e: OSError) -> dict:
        code = 127 if isinstance(e, FileNotFoundError) else 126
        msg = f"posttrain: cannot execute {name!r}: {e.strerror or e}\n".encode()
        return {"exit_code": code, "stdout": b"", "stderr": msg, "stdout_truncated": False,
                "stderr_truncated": False, "wall_s": 0.0, "cpu_s": 0.0, "peak_memory_mb": None,
                "limit": None, "signal": None}

    def run_python(self, req: dict) -> dict:
        self.warm.ensure()
        child, ours = _pipes(req.get("stdin"))
        before = self.runner.counters()
        self.runner.reset_peak()
        job = {"code": req["code"], "args": list(req.get("args", ())), "cwd": self.runner_cwd(),
               "cpu_s": max(1, int(round(self.limits.cpu_s)))}
        try:
            send_json(self.warm.sock, job, fds=list(child))
        except OSError:
            self.warm.kill()
            raise RuntimeError("the fork-server died between jobs") from None
        finally:
            for fd in child:
                os.close(fd)
        status: dict = {}
        self.warm.job_pid = None

        def on_done() -> bool:
            try:
                msg, _ = recv_json(self.warm.sock)
                if "status" not in msg:  # {"pid": N}: the job started
                    self.warm.job_pid = int(msg["pid"])
                    return False
                st = int(msg["status"])
                status.update(status=st, cpu_s=float(msg["cpu_s"]),
                              maxrss_kb=int(msg["maxrss_kb"]))
            except (EOFError, OSError, ValueError, KeyError, TypeError):
                status["server_died"] = True
            return True

        try:
            cap = pump(out_fd=ours[1], err_fd=ours[2], stdin_fd=ours[0],
                       stdin_data=req.get("stdin"), done_fd=self.warm.sock.fileno(),
                       on_done=on_done, kill=lambda: self.warm.handle.kill(job_pid=self.warm.job_pid),
                       timeout=req["timeout"],
                       limits=self.limits, hangup_fd=self.host.fileno())
        finally:
            for fd in ours[1:]:
                os.close(fd)
        if cap.killed or "server_died" in status:
            self.warm.kill()  # started again on the next job
        if "server_died" in status:
            exit_code, sig = None, None
            if cap.killed is None:
                cap.err += b"\n[posttrain] the fork-server died during this job (the job killed it?)\n"
        else:
            code = os.waitstatus_to_exitcode(status["status"])
            exit_code, sig = (None, -code) if code < 0 else (code, None)
        return self._result(cap, exit_code, sig, status, before)

    def runner_cwd(self) -> str:
        return self.runner.inside_ws

    def _result(self, cap, exit_code, sig, status, before) -> dict:
        after = self.runner.counters()
        oom = after.get("oom_kill", 0) > before.get("oom_kill", 0)
        pids = after.get("pids_max", 0) > before.get("pids_max", 0)
        limit = None
        if cap.killed == "timeout":
            limit = LimitReason.TIMEOUT
        elif cap.killed == "output":
            limit = LimitReason.OUTPUT
        elif sig == signal.SIGXCPU:
            limit = LimitReason.CPU
        elif sig == signal.SIGXFSZ:
            limit = LimitReason.FILESIZE
        elif oom and (sig is not None or exit_code != 0):
            limit = LimitReason.MEMORY
        elif pids and (sig is not None or exit_code != 0):
            limit = LimitReason.PIDS
        elif sig is not None:
            limit = LimitReason.SIGNAL
        peak = self.runner.peak_mb()
        if peak is None and "maxrss_kb" in status:
            peak = status["maxrss_kb"] / 1024
        return {
            "exit_code": None if (limit or sig) else exit_code,
            "stdout": bytes(cap.out), "stderr": bytes(cap.err),
            "stdout_truncated": cap.out_total > len(cap.out),
            "stderr_truncated": cap.err_total > len(cap.err),
            "wall_s": cap.wall_s, "cpu_s": status.get("cpu_s", 0.0), "peak_memory_mb": peak,
            "limit": limit.value if limit else None, "signal": sig,
        }

    def shutdown(self) -> None:
        self.warm.kill()
        self.runner.shutdown()


def main() -> None:
    host = socket.socket(fileno=int(sys.argv[1]))
    cfg = recv_obj(host)
    sup = None
    try:
        sup = Supervisor(cfg, host)
        info = sup.boot()
    except BaseException as e:
        send_obj(host, {"ok": False, "kind": "SandboxUnavailable",
                        "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()})
        if sup is not None:
            sup.shutdown()
        return
    send_obj(host, {"ok": True, **info})
    while True:
        try:
            req = recv_obj(host)
        except (EOFError, OSError):
            break
        if req.get("op") == "close":
            break
        t0 = time.monotonic()
        try:
            resp = {"ok": True, **sup.handle(req)}
        except EOFError:
            break  # the host went away in the middle of a command
        except KeyError as e:
            resp = {"ok": False, "kind": "ValueError", "error": str(e.args[0])}
        except BaseException as e:
            resp = {"ok": False, "kind": "SandboxError", "error": f"{type(e).__name__}: {e}",
                    "traceback": traceback.format_exc()}
        resp["supervisor_s"] = time.monotonic() - t0
        try:
            send_obj(host, resp)
        except OSError:
            break
        idle = getattr(sup.runner, "idle", None)
        if idle:
            idle()
    sup.shutdown()
    try:
        send_obj(host, {"ok": True, "closed": True})
    except OSError:
        pass


if __name__ == "__main__":
    main()
