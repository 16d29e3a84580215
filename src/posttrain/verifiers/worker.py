"""A grading child process: where a scorer evaluates the policy's answer, away from the judge.

Some scorers evaluate what the policy wrote: sympy parses it (`math`, reasoning-gym's
integration, countdown and puzzle24 scorers), and a parse can run for ever (`9**9**9**9`) or use
gigabytes. Run in the episode runner's own process, such an answer hangs or kills the run, and a
timeout that relies on `signal.alarm` works only in a process's main thread (episodes are graded
on worker threads). So these scorers run in one long-lived child process per grading process
(`spawn`ed: it imports only what its `setup` imports), one call at a time:

* a call that outlives its timeout kills the child (a fresh one starts on the next call) and is
  the answer's failure: the answer is what made it too costly to evaluate;
* a child that dies during a call is replaced and the call repeated once; a child that dies on
  the same input twice was killed by it (`AnswerKilledWorker`: a failure, so an answer that
  crashes its scorer is never turned into a dropped, retried infrastructure error); a child that
  cannot start (its imports fail, it is not ready in `FIRST_CALL_S`) is an infrastructure error
  (`VerifierError`).

What this is *not*: a sandbox against code execution. A scorer that `eval`s the answer must be
given only answers that cannot execute code (the scorer's caller checks their form first, e.g.
`posttrain.tasks.families.rg_answers`): code running in the child could write its result. The
child does drop what it can cheaply (where the host allows it, a network namespace of its own;
no file may grow: `RLIMIT_FSIZE` 0), as a second line behind that check.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import resource
import signal
import threading
from collections.abc import Callable
from typing import Any

from posttrain.verifiers.base import VerifierError

FIRST_CALL_S = 30.0
"""extra seconds the first call of a child may take (its start and imports)"""

CLONE_NEWUSER, CLONE_NEWNET = 0x10000000, 0x40000000


class AnswerKilledWorker(Exception):
    """The grading child died twice on the same input: the input is what kills it."""


def harden() -> None:
    """What the grading child gives up before it reads any input: the network (a namespace of
    its own: as root directly, otherwise inside a user namespace where the host allows one) and
    writing files (`RLIMIT_FSIZE` 0; a write that would grow a file fails with EFBIG)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNET) != 0:
        libc.unshare(CLONE_NEWUSER | CLONE_NEWNET)  # best effort: not every host allows it
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))


def _child(setup: Callable[[], Any], handle: Callable[[Any, Any], Any], conn: Any) -> None:
    """The grading child: hardened, set up (its imports), "ready", then one answer a request."""
    harden()
    state = setup()
    conn.send(("ready", None))
    while True:
        try:
            request = conn.recv()
        except EOFError:
            return
        try:
            conn.send(("ok", handle(state, request)))
        except Exception as e:  # noqa: BLE001 - what the input made the scorer raise: the caller's to judge
            conn.send(("raised", f"{type(e).__name__}: {str(e)[:300]}"))


class GradingWorker:
    """One grading child process at a time, shared by the threads of this process.

    In the child, `setup()` runs once (imports, caches) and `handle(state, request)` answers each
    request. `call(request, timeout_s)` returns ("ok", answer), ("raised", "Error: message") where
    `handle` raised, or ("timeout", None) where the call outlived `timeout_s` (the child is
    killed). Both functions must be importable by name (the child is `spawn`ed)."""

    def __init__(self, setup: Callable[[], Any], handle: Callable[[Any, Any], Any], name: str) -> None:
        self._setup, self._handle, self._name = setup, handle, name
        self._lock = threading.Lock()
        self._proc: Any = None
        self._conn: Any = None

    def _start(self) -> None:
        ctx = multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_child, args=(self._setup, self._handle, child), daemon=True,
                           name=self._name)
        try:
            proc.start()
            child.close()
            if not parent.poll(FIRST_CALL_S) or parent.recv()[0] != "ready":
                raise VerifierError("not ready in time")
        except Exception as e:  # noqa: BLE001 - whatever stops the child from starting
            proc.kill()
            proc.join(5)
            parent.close()
            raise VerifierError(f"the {self._name} process could not start: {type(e).__name__}: {e}") from e
        self._proc, self._conn = proc, parent

    def _stop(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.join(5)
            self._conn.close()
        self._proc = self._conn = None

    def _once(self, request: Any, timeout_s: float) -> tuple[str, Any]:
        if self._proc is None or not self._proc.is_alive():
            self._start()
        self._conn.send(request)
        if not self._conn.poll(timeout_s):
            self._stop()
            return "timeout", None
        return self._conn.recv()

    def call(self, request: Any, timeout_s: float) -> tuple[str, Any]:
        with self._lock:
            try:
                return self._once(request, timeout_s)
            except (EOFError, OSError):
                self._stop()  # died: another child (ready, so its start is sound) gets it again
            try:
                return self._once(request, timeout_s)
            except (EOFError, OSError) as e:
                self._stop()
                raise AnswerKilledWorker(f"the {self._name} process died twice on this input "
                                         f"({type(e).__name__})") from e

    def pid(self) -> int | None:
        """The child's pid, None while none runs."""
        with self._lock:
            return self._proc.pid if self._proc is not None else None

    def close(self) -> None:
        with self._lock:
            self._stop()
