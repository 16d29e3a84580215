"""The host side of a sandbox: `SupervisedSandbox`, which implements the `Sandbox` protocol.

Each sandbox is one supervisor process (see `supervisor.py`) plus the processes it launches.
This object sends it requests, one at a time (a lock serialises concurrent callers), and turns
replies into `RunResult`s or exceptions. File operations do not go through the supervisor: the
host reaches the workspace directly (through `/proc/<supervisor>/root`, i.e. inside the
supervisor's mount namespace) with the escape-safe walk of `workspace.py`.

A supervisor that dies, or stops answering, makes every later call raise `SandboxBroken`.
"""

from __future__ import annotations

import dataclasses
import math
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import uuid
import weakref
from collections.abc import Mapping, Sequence

from posttrain.sandbox.base import (
    DEFAULT_CLOCK,
    Limits,
    RunResult,
    SandboxBroken,
    SandboxError,
    SandboxInfo,
    SandboxUnavailable,
    clock_env,
)
from posttrain.sandbox.insidedir import inside_dir, split_preload
from posttrain.sandbox.protocol import recv_obj, send_obj
from posttrain.sandbox.reset import ResetReport
from posttrain.sandbox.workspace import Workspace

SUPERVISOR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "supervisor.py")
BOOT_TIMEOUT_S = 60.0
"""how long a supervisor may take to report ready"""
REPLY_MARGIN_S = 30.0
"""how long past a command's own timeout the host waits for the reply before it declares the
sandbox broken (a hung or stopped supervisor)"""

_ERRORS = {"SandboxError": SandboxError, "SandboxUnavailable": SandboxUnavailable,
           "ValueError": ValueError}


def _check_env(env: Mapping[str, str] | None) -> dict[str, str] | None:
    if env is None:
        return None
    out = {}
    for k, v in dict(env).items():
        if not (isinstance(k, str) and k and "=" not in k and "\0" not in k):
            raise ValueError(f"env: invalid variable name {k!r}")
        if not (isinstance(v, str) and "\0" not in v):
            raise ValueError(f"env[{k!r}]: value must be a str without NUL bytes, got {v!r}")
        out[k] = v
    return out


def _check_timeout(timeout: float | None, default: float) -> float:
    if timeout is None:
        return float(default)
    # finite too: a command with no time limit is one a policy can hang (inf is not a timeout)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < math.inf:
        raise ValueError(f"timeout must be a positive, finite number of seconds, got {timeout!r}")
    return float(timeout)


def _check_stdin(stdin: str | bytes | None) -> bytes | None:
    if stdin is None or isinstance(stdin, bytes):
        return stdin
    if isinstance(stdin, str):
        return stdin.encode()
    raise TypeError(f"stdin must be str, bytes or None, got {type(stdin).__name__}")


def _shutdown(proc: subprocess.Popen, sock: socket.socket, slots: list, stderr,
              cleanup: list[str]) -> None:
    """Stop a supervisor and free what it held (also run by the finalizer at exit/GC)."""
    clean = False
    try:
        sock.settimeout(5.0)
        send_obj(sock, {"op": "close"})
        clean = bool(recv_obj(sock).get("clean"))
    except (OSError, EOFError, ValueError):
        pass
    sock.close()
    try:
        proc.wait(timeout=5.0)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    for slot in slots:
        slot.release(clean=clean and proc.returncode == 0)
    for path in cleanup:  # what a supervisor that was killed could not remove itself
        shutil.rmtree(path, ignore_errors=True)
    stderr.close()


class SupervisedSandbox:
    """A sandbox run by a supervisor process; `mode` is "bwrap" or "process"."""

    def __init__(self, limits: Limits, *, mode: str, preload: Sequence[str] = (),
                 image: str = "", layers: Mapping[str, bool] | None = None,
                 extra_config: Mapping | None = None, clock: int | None = DEFAULT_CLOCK) -> None:
        if not isinstance(limits, Limits):
            raise TypeError(f"limits must be a posttrain.sandbox.Limits, got {limits!r}")
        clock_env(clock)  # refuses a bad clock before anything starts
        self.id = uuid.uuid4().hex[:12]
        self.limits = limits
        self._lock = threading.Lock()
        self._broken: str | None = None
        self._closed = False
        self._slot = None
        slots = []
        if mode == "bwrap" and os.geteuid() == 0:
            from posttrain.sandbox.slots import acquire_slot
            slots.append(acquire_slot(uid_range=bool((extra_config or {}).get("image"))))
            if (extra_config or {}).get("two_uids"):  # the candidates' own host uid
                try:
                    slots.append(acquire_slot())
                except BaseException:
                    slots[0].release()
                    raise
            self._slot = slots[0]
        names, files = split_preload(preload)
        cfg = {"mode": mode, "id": self.id, "limits": dataclasses.asdict(limits), "clock": clock,
               "preload": names, "python": sys.executable, "inside_dir": inside_dir(files),
               "uid": self._slot.uid if self._slot else None, **(extra_config or {}),
               "candidate_uid": slots[1].uid if len(slots) > 1 else None}
        host, theirs = socket.socketpair()
        self._stderr = tempfile.TemporaryFile()
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-I", "-S", SUPERVISOR, str(theirs.fileno())],
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=self._stderr, env={},
                start_new_session=True)  # a Ctrl-C meant for the host is not the sandbox's
        except BaseException:
            for slot in slots:
                slot.release()
            raise
        finally:
            theirs.close()
        self._sock = host
        self._cleanup: list[str] = []
        self._finalizer = weakref.finalize(self, _shutdown, self._proc, host, slots,
                                           self._stderr, self._cleanup)
        try:
            host.settimeout(BOOT_TIMEOUT_S)
            send_obj(host, cfg)
            reply = recv_obj(host)
            host.settimeout(None)
        except (OSError, EOFError, ValueError) as e:
            self._finalizer()
            raise SandboxUnavailable(f"sandbox supervisor did not start ({e!r}): "
                                     f"{self._stderr_tail()}") from None
        if not reply.get("ok"):
            self._finalizer()
            raise SandboxUnavailable(f"sandbox could not start: {reply.get('error')}\n"
                                     f"{reply.get('traceback', '')}")
        self._sup_pid = reply["pid"]
        if reply.get("cleanup_dir"):
            self._cleanup.append(reply["cleanup_dir"])
        ws = f"/proc/{self._sup_pid}/root{reply['workspace']}"
        owner = (self._slot.uid, self._slot.uid) if self._slot else None
        if reply.get("owner"):  # an image sandbox: the image user's ids in the slot's range
            owner = tuple(reply["owner"])
        self._ws = Workspace(lambda: ws, owner=owner, inside_path=reply["inside_path"])
        self.host_uid = self._slot.uid if self._slot else None
        """the host uid this sandbox's processes run as (bubblewrap backend run as root)"""
        self.host_uid_count = self._slot.count if self._slot else 1
        """how many host uids from `host_uid` on are this sandbox's (65536 for an image)"""
        self.candidate_host_uid = slots[1].uid if len(slots) > 1 else None
        """a two-uid sandbox's second host uid: what its grader's candidate programs run as"""
        self.workspace_path = reply["inside_path"]
        """where the workspace is, as seen by commands in the sandbox"""
        self.info = SandboxInfo(backend=mode, image=image,
                                layers=dict(layers or {}, **reply.get("layers", {})), clock=clock,
                                modules=files)
        image_cfg = (extra_config or {}).get("image") or {}
        self._service: list[str] | None = image_cfg.get("service")
        """an image's ENTRYPOINT/CMD: started now and after every reset (part of its state)"""
        self._service_cwd = image_cfg.get("workdir", "/")
        if self._service:
            try:
                self.start_service()
            except BaseException:
                self._finalizer()
                raise

    # -- plumbing ------------------------------------------------------------------------
    def _stderr_tail(self) -> str:
        try:
            self._stderr.seek(0)
            return self._stderr.read()[-2000:].decode(errors="replace")
        except (OSError, ValueError):
            return ""

    def _mark_broken(self, why: str) -> SandboxBroken:
        if self._broken is None:
            self._broken = why
            try:
                self._proc.kill()
            except OSError:
                pass
        return SandboxBroken(f"sandbox {self.id} is broken: {self._broken}")

    def _check_usable(self) -> None:
        if self._closed:
            raise SandboxError(f"sandbox {self.id} is closed")
        if self._broken is not None:
            raise SandboxBroken(f"sandbox {self.id} is broken: {self._broken}")
        if self._proc.poll() is not None:
            raise self._mark_broken(f"its supervisor exited ({self._proc.returncode}); "
                                    f"{self._stderr_tail()}")

    def _call(self, req: dict, timeout: float) -> dict:
        with self._lock:
            self._check_usable()
            try:
                self._sock.settimeout(timeout)
                send_obj(self._sock, req)
                resp = recv_obj(self._sock)
            except TimeoutError:
                raise self._mark_broken(f"no reply to {req['op']!r} within {timeout:.0f} s") from None
            except (OSError, EOFError, ValueError) as e:
                raise self._mark_broken(f"its supervisor died during {req['op']!r} ({e!r}); "
                                        f"{self._stderr_tail()}") from None
        if not resp.get("ok"):
            cls = _ERRORS.get(str(resp.get("kind")), SandboxError)
            raise cls(f"sandbox {self.id}: {resp.get('error')}")
        return resp

    def _file_op(self, fn, *args):
        with self._lock:
            self._check_usable()
            try:
                return fn(*args)
            except FileNotFoundError:
                if self._proc.poll() is not None or not os.path.exists(f"/proc/{self._sup_pid}"):
                    raise self._mark_broken("its supervisor exited") from None
                raise

    # -- the Sandbox protocol ------------------------------------------------------------
    def run(self, command: str | Sequence[str], *, stdin: str | bytes | None = None,
            timeout: float | None = None, env: Mapping[str, str] | None = None) -> RunResult:
        if isinstance(command, str):
            argv = ["/bin/sh", "-c", command]
        elif (isinstance(command, (list, tuple)) and command
              and all(isinstance(a, str) for a in command)):
            argv = list(command)
        else:
            raise ValueError(f"command must be a str or a non-empty list of str, got {command!r}")
        if any("\0" in a for a in argv):
            raise ValueError(f"command contains a NUL byte: {argv!r}")
        t = _check_timeout(timeout, self.limits.wall_s)
        resp = self._call({"op": "run", "argv": argv, "stdin": _check_stdin(stdin),
                           "timeout": t, "env": _check_env(env)}, t + REPLY_MARGIN_S)
        return self._result(resp)

    def run_python(self, code: str, *, stdin: str | bytes | None = None,
                   timeout: float | None = None, args: Sequence[str] = (), cache: bool = False) -> RunResult:
        """`Sandbox.run_python`; `cache`: `code` is the host's own program, run many times (a
        grading program): the job server compiles it once and keeps the code object (never
        for the policy's code: it would be compiled in the server's process)."""
        if not isinstance(code, str):
            raise TypeError(f"code must be a str, got {type(code).__name__}")
        if isinstance(args, str) or not all(isinstance(a, str) for a in args):
            raise ValueError(f"args must be a sequence of str, got {args!r}")
        t = _check_timeout(timeout, self.limits.wall_s)
        resp = self._call({"op": "run_python", "code": code, "args": list(args),
                           "stdin": _check_stdin(stdin), "timeout": t, "cache": bool(cache)},
                          t + REPLY_MARGIN_S + 120.0)  # + a fork-server (re)start
        return self._result(resp)

    @staticmethod
    def _result(resp: dict) -> RunResult:
        d = {f.name: resp[f.name] for f in dataclasses.fields(RunResult)}
        d["stdout"] = d["stdout"].decode("utf-8", errors="replace")
        d["stderr"] = d["stderr"].decode("utf-8", errors="replace")
        return RunResult.from_dict(d)

    def write_file(self, path: str, data: str | bytes, *, mode: int = 0o644) -> None:
        self._file_op(self._ws.write_file, path, data, mode)

    def make_dir(self, path: str, mode: int = 0o755) -> None:
        self._file_op(self._ws.make_dir, path, mode)

    def make_symlink(self, path: str, target: str) -> None:
        self._file_op(self._ws.make_symlink, path, target)

    def read_file(self, path: str) -> bytes:
        return self._file_op(self._ws.read_file, path)

    def list_files(self, path: str = ".") -> list[str]:
        return self._file_op(self._ws.list_files, path)

    def archive(self) -> bytes:
        return self._file_op(self._ws.archive)

    def snapshot(self) -> str:
        return self._call({"op": "snapshot"}, 60.0)["id"]

    def restore(self, snapshot_id: str) -> None:
        if not isinstance(snapshot_id, str):
            raise ValueError(f"snapshot id must be a str, got {snapshot_id!r}")
        self._call({"op": "restore", "id": snapshot_id}, 60.0)

    def commit(self, dest: str) -> None:
        """An image build step: stop everything and write what the commands changed as a new
        image layer at the host path `dest` (see `posttrain.images`)."""
        self._call({"op": "commit", "dest": str(dest)}, 600.0)

    def kill_processes(self) -> int:
        """Kill every process earlier commands left running (background jobs, daemons); the
        sandbox stays usable. Returns how many were killed."""
        return int(self._call({"op": "kill_processes"}, 60.0)["killed"])

    SERVICE_LOG = "/tmp/.posttrain-service.log"

    def start_service(self) -> None:
        """Start an image's service (ENTRYPOINT/CMD) in the background, in its own session, in
        the image's WORKDIR, output to SERVICE_LOG; nothing for a sandbox without one."""
        if not self._service:
            return
        # in the background of a non-interactive shell, setsid execs (no fork): $! is the
        # service's pid and its session's id, which kill_processes then spares
        script = f'cd "$1" && shift && setsid "$@" </dev/null >{self.SERVICE_LOG} 2>&1 & echo $!'
        r = self.run(["/bin/sh", "-c", script, "service", self._service_cwd, *self._service],
                     timeout=30)
        if r.exit_code != 0 or not r.stdout.strip().isdigit():
            raise SandboxError(f"sandbox {self.id}: the image's service {self._service} could "
                               f"not start: {r.stderr[-300:]}")
        self._call({"op": "service", "sid": int(r.stdout)}, 10.0)

    def reset(self) -> ResetReport:
        """Back to pristine for the next episode (see `Sandbox.reset`); an image's service is
        started again. Never raises for a sandbox that cannot be reset: the report says so (and
        why), and the caller closes it."""
        try:
            report = ResetReport.from_dict(self._call({"op": "reset"}, 60.0)["report"])
            if report.reusable:
                self.start_service()
            return report
        except SandboxError as e:
            return ResetReport(False, f"{type(e).__name__}: {e}")

    def alive(self, probe: bool = True) -> bool:
        """True if the supervisor answers. `probe=False`: without a round trip, only whether
        the sandbox is open, not broken and its supervisor has not exited (what a pool checks
        before handing out a sandbox that answered a moment ago: its boot or its reset)."""
        if not probe:
            return not (self._closed or self._broken is not None or self._proc.poll() is not None)
        try:
            self._call({"op": "ping"}, 10.0)
            return True
        except SandboxError:
            return False

    def close(self, wait: bool = True) -> None:
        """Kill everything in the sandbox and free it. `wait=False` returns at once and finishes
        in a background thread (the sandbox is unusable from the moment of the call)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if wait:
            self._finalizer()
        else:
            threading.Thread(target=self._finalizer, name=f"close-{self.id}", daemon=False).start()

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> SupervisedSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("broken" if self._broken else "open")
        return f"<Sandbox {self.id} {self.info.backend} {state}>"
