"""The per-sandbox supervisor: a small process outside the sandbox that runs its commands.

The host starts one supervisor per sandbox (`python -I -S supervisor.py FD`) and talks to it over
a Unix socket (pickled requests, see `protocol.py`). The supervisor is single-threaded. It owns
the sandbox's mounts (bubblewrap backend: in a private mount namespace) and cgroup, keeps the
sandbox's job server (`inside/_forkserver.py`, which starts every command), enforces the wall
timeout and the output caps (`execute.pump`), and turns what happened into a `RunResult` dict.
When the host's end of the socket closes (the host exited or was killed), the supervisor kills
everything and exits: nothing of a sandbox outlives its host.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import sys
import time
import traceback
from typing import Any

if __name__ == "__main__":  # started as a script with -I -S: make `posttrain` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from posttrain.sandbox.base import LimitReason, Limits  # noqa: E402
from posttrain.sandbox.execute import pump  # noqa: E402
from posttrain.sandbox.protocol import (  # noqa: E402
    DONE,
    READY,
    read_started,
    recv_obj,
    recv_report,
    send_job,
    send_obj,
)
from posttrain.sandbox.reset import ResetReport, judge  # noqa: E402

SERVER_BOOT_TIMEOUT_S = 120.0
"""how long the job server may take to import its preloads before the sandbox is broken"""


class JobServer:
    """The sandbox's fork-server: started at boot, restarted after something killed it."""

    def __init__(self, runner, preload: list[str]) -> None:
        self.runner = runner
        self.preload = preload
        self.handle: Any = None
        """the runner's handle of the running server (BwrapHandle or ProcessHandle), or None"""
        self.sock: socket.socket | None = None
        self.started_r: int | None = None
        self.ready = False
        self.job_pid: int | None = None
        """the running job's pid as the server sees it (None until the server wrote it to the
        started pipe; the process backend kills a timed-out job's process group by it)"""

    def start(self) -> None:
        ours, theirs = socket.socketpair()
        started_r, started_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
        try:
            self.handle = self.runner.spawn(
                self.runner.server_argv(theirs.fileno(), started_w, self.preload), stdin=null,
                stdout=null, stderr=null, pass_fds=(theirs.fileno(), started_w))
        except BaseException:
            os.close(started_r)
            raise
        finally:
            os.close(null)
            os.close(started_w)
            theirs.close()
        self.sock, self.started_r, self.ready = ours, started_r, False

    def started(self) -> int | None:
        """The pid of the job running now, if the server has started it."""
        pid = read_started(self.started_r) if self.started_r is not None else None
        if pid is not None:
            self.job_pid = pid
        return self.job_pid

    def alive(self) -> bool:
        if self.handle is None:
            return False
        readable, _, _ = select.select([self.handle.pidfd], [], [], 0)
        return not readable  # a pidfd becomes readable when its process exits

    def ensure(self) -> None:
        """A ready server: the running one, or a new one if it died since the last job (the
        OOM killer, a job that killed it, someone outside)."""
        if self.handle is not None and not self.alive():
            self.kill()
        if self.handle is None:
            self.start()
        if self.ready:
            return
        assert self.sock is not None  # start() opened it
        self.sock.settimeout(SERVER_BOOT_TIMEOUT_S)
        try:
            kind, errors = recv_report(self.sock)
        except (EOFError, OSError, ValueError) as e:
            self.kill()
            raise RuntimeError(f"the sandbox's job server did not start: {e!r}") from None
        finally:
            if self.sock is not None:
                self.sock.settimeout(None)
        if kind != READY:
            self.kill()
            raise RuntimeError("the sandbox's job server sent a malformed greeting")
        if errors:
            self.kill()
            raise RuntimeError(f"preload failed inside the sandbox: {errors}")
        self.runner.server_ready(self.handle)
        self.ready = True

    def kill(self) -> None:
        if self.handle is not None:
            self.handle.kill()
            try:
                os.waitpid(self.handle.pid, 0)
            except ChildProcessError:
                pass
            self.handle.close()
        if self.sock is not None:
            self.sock.close()
        if self.started_r is not None:
            os.close(self.started_r)
        self.handle, self.sock, self.started_r, self.ready = None, None, None, False


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
        # two runners with their own handle types (BwrapHandle, ProcessHandle) behind the same
        # method names; no shared protocol declares them yet
        self.runner: Any
        if cfg["mode"] == "bwrap":
            from posttrain.sandbox.bwrap_runner import BwrapRunner
            self.runner = BwrapRunner(cfg)
        else:
            from posttrain.sandbox.process import ProcessRunner
            self.runner = ProcessRunner(cfg)
        self.server = JobServer(self.runner, list(cfg.get("preload", ())))

    def boot(self) -> dict:
        info = self.runner.boot()
        self.server.start()  # imports its preloads while the host does other things
        return {"pid": os.getpid(), **info}

    # -- requests ------------------------------------------------------------------------
    def handle(self, req: dict) -> dict:
        op = req["op"]
        if op == "run":
            return self.job({"argv": req["argv"], "env": req.get("env") or {}}, req)
        if op == "run_python":
            return self.job({"code": req["code"], "args": list(req.get("args", ())),
                             "cache": bool(req.get("cache"))}, req)
        if op == "snapshot":
            return {"id": self.runner.snapshot()}
        if op == "restore":
            if req["id"] not in self.runner.snapshots:
                raise ValueError(f"unknown snapshot id {req['id']!r}")
            if getattr(self.runner, "service_sids", None):
                self.runner.service_sids.clear()  # a restore kills everything
            self.kill_processes()  # nothing keeps writing into the workspace being replaced
            self.runner.restore(req["id"])
            return {}
        if op == "kill_processes":
            return {"killed": self.kill_processes()}
        if op == "reset":
            return {"report": self.reset().to_dict()}
        if op == "service":  # an image's service runs in this session: spare it before grading
            self.runner.service_sids.add(int(req["sid"]))
            return {}
        if op == "commit":
            self.server.kill()  # nothing may write into the layer being copied
            self.runner.kill_processes(None)
            self.runner.commit(req["dest"])
            return {}
        if op == "ping":
            return {}
        raise ValueError(f"unknown request {op!r}")

    def kill_processes(self) -> int:
        """Kill what earlier commands left running; the job server stays (or is restarted,
        if the backend cannot tell it from the rest)."""
        killed = self.runner.kill_processes(self.server.handle)
        if killed is None:
            self.server.kill()
            return 0
        return killed

    def reset(self) -> ResetReport:
        """Back to pristine for the next episode (see `reset.py`); the report says whether the
        sandbox may serve again."""
        t0 = time.monotonic()
        if getattr(self.runner, "image", None):
            self.server.kill()

            def start():  # a job server in the new tree, ready (it has pivoted into it)
                self.server.start()
                self.server.ensure()
                return self.server.handle

            facts = self.runner.reset_image(start)
            ok, why = judge(facts)
            return ResetReport(ok, why, facts.killed or 0, time.monotonic() - t0,
                               {"places": [p.path for p in facts.places]})
        alive = self.server.handle is not None and self.server.alive()
        if alive and not self.server.ready:  # booted, but no job ran yet: wait for it
            try:
                self.server.ensure()
            except RuntimeError:
                alive = False
        details: dict = {}
        if alive:
            facts = self.runner.reset(self.server.handle)
        else:
            # The job server died during the episode (under bubblewrap nothing inside can kill
            # it, it is pid 1: the OOM killer; with the process backend any job can). Its pid
            # namespace died with it, taking every process started in it along; the runner
            # kills what else is left, remounts the writable places, then starts a new job
            # server (as a boot does) and probes through it. Cheaper than a new sandbox
            # (no supervisor, no mounts), and judged by the same rules.
            self.server.kill()  # reap it, close its socket

            def start():
                self.server.ensure()
                return self.server.handle

            facts = self.runner.reset(None, start_server=start)
            details["server_restarted"] = True
        ok, why = judge(facts)
        return ResetReport(ok, why, facts.killed or 0, time.monotonic() - t0,
                           {"places": [p.path for p in facts.places], **details})

    def kill_job(self) -> None:
        """Stop the running job and everything it started, keeping the server if we can."""
        if not self.runner.kill_job(self.server.handle, self.server.started()):
            self.server.handle.kill()  # no way to tell the job from the server: both go

    def job(self, payload: dict, req: dict) -> dict:
        payload.update(cwd=self.runner.inside_ws, cpu_s=max(1, int(round(self.limits.cpu_s))))
        for _attempt in range(2):
            result = self._attempt(payload, req)
            if result is not None:
                return result
            # the server died before it started the job (killed from outside between two
            # commands, say): the job never ran, so run it once more on a new server
        raise RuntimeError("the sandbox's job server keeps dying before it starts a command")

    def _attempt(self, payload: dict, req: dict) -> dict | None:
        server = self.server
        server.ensure()
        child, ours = _pipes(req.get("stdin"))
        before = self.runner.counters()
        self.runner.reset_peak()
        server.started()  # drain: what is written from here on is this job's
        server.job_pid = None
        sock = server.sock
        assert sock is not None  # ensure() started the server
        try:
            send_job(sock, payload, list(child))
        except OSError:
            send_failed = True
        else:
            send_failed = False
        finally:
            for fd in child:
                os.close(fd)
        status: dict = {}

        def on_done() -> bool:
            try:
                kind, body = recv_report(sock)
            except (EOFError, OSError, ValueError):
                status["server_died"] = True
                return True
            if kind != DONE or not isinstance(body, tuple):
                status["server_died"] = True  # a confused server is as good as a dead one
                return True
            status.update(status=body[0], cpu_s=body[1], maxrss_kb=body[2])
            return True

        try:
            if send_failed:
                status["server_died"] = True
                cap = None
            else:
                cap = pump(out_fd=ours[1], err_fd=ours[2], stdin_fd=ours[0],
                           stdin_data=req.get("stdin"), done_fd=sock.fileno(),
                           on_done=on_done, kill=self.kill_job, timeout=req["timeout"],
                           limits=self.limits, hangup_fd=self.host.fileno())
        finally:
            if send_failed and ours[0] is not None:
                os.close(ours[0])
            for fd in ours[1:]:
                os.close(fd)
        if "server_died" in status:
            started = server.started() is not None
            server.kill()  # reaped here; a new one starts with the next command
            if not started or cap is None:
                return None  # it never started the job (or it was never sent)
            exit_code, sig = None, None
            if cap.killed is None:
                cap.err += b"\n[posttrain] the sandbox's job server was killed during this " \
                           b"command (by the command?); it has been restarted\n"
        else:
            code = os.waitstatus_to_exitcode(status["status"])
            exit_code, sig = (None, -code) if code < 0 else (code, None)
        return self._result(cap, exit_code, sig, status, before)

    def _result(self, cap, exit_code, sig, status, before) -> dict:
        after = self.runner.counters()
        oom = after.get("oom_kill", 0) > before.get("oom_kill", 0)
        pids = after.get("pids_max", 0) > before.get("pids_max", 0)
        failed = sig is not None or exit_code != 0
        limit = None
        if cap.killed == "timeout":
            limit = LimitReason.TIMEOUT
        elif cap.killed == "output":
            limit = LimitReason.OUTPUT
        elif sig == signal.SIGXCPU:
            limit = LimitReason.CPU
        elif sig == signal.SIGXFSZ:
            limit = LimitReason.FILESIZE
        elif oom and failed:
            limit = LimitReason.MEMORY
        elif pids and failed:
            limit = LimitReason.PIDS
        elif sig is not None or "server_died" in status:
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

    def shutdown(self) -> bool:
        """Kill everything; True if the sandbox is known to be empty afterwards."""
        self.server.kill()
        return self.runner.shutdown()


def main() -> None:
    host = socket.socket(fileno=int(sys.argv[1]))
    os.set_inheritable(host.fileno(), False)  # never into a sandbox (posix_spawn inherits)
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
        except ValueError as e:
            resp = {"ok": False, "kind": "ValueError", "error": str(e)}
        except BaseException as e:
            resp = {"ok": False, "kind": "SandboxError", "error": f"{type(e).__name__}: {e}",
                    "traceback": traceback.format_exc()}
        resp["supervisor_s"] = time.monotonic() - t0
        try:
            send_obj(host, resp)
        except OSError:
            break
        sup.runner.idle()
    clean = sup.shutdown()
    try:
        send_obj(host, {"ok": True, "closed": True, "clean": clean})
    except OSError:
        pass


if __name__ == "__main__":
    main()
