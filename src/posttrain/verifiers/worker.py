"""A grading child process: where a scorer evaluates the policy's answer, away from the judge.

Some scorers evaluate what the policy wrote: sympy parses it (`math`, reasoning-gym's
integration, countdown and puzzle24 scorers), and a parse can run for ever (`9**9**9**9`) or use
gigabytes. Run in the episode runner's own process, such an answer hangs or kills the run, and a
timeout that relies on `signal.alarm` works only in a process's main thread (episodes are graded
on worker threads). So these scorers run in long-lived child processes (`spawn`ed: they import
only what their `setup` imports), a few per grading process, one call at a time each:

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
import os
import queue
import resource
import signal
from collections.abc import Callable
from typing import Any

from posttrain.verifiers.base import VerifierError

FIRST_CALL_S = 120.0
"""seconds a child may take to start and import its libraries (reasoning-gym: ~3 s idle, ~11 s
on a loaded 2-core machine)"""

DEFAULT_SIZE = min(4, os.cpu_count() or 1)
"""grading children a process may run at once (each imports its scorer's libraries)"""

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


class _Child:
    """One grading child process (started on first use, again after it was killed)."""

    def __init__(self, setup: Callable[[], Any], handle: Callable[[Any, Any], Any], name: str) -> None:
        self._setup, self._handle, self._name = setup, handle, name
        self.proc: Any = None
        self._conn: Any = None
        self.owner = os.getpid()
        """the process that started `proc`: only it can talk to it"""

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
            if proc.pid is not None:  # started (else kill() has no process to signal)
                proc.kill()
                proc.join(5)
            parent.close()
            raise VerifierError(f"the {self._name} process could not start: {type(e).__name__}: {e}") from e
        self.proc, self._conn, self.owner = proc, parent, os.getpid()

    def _forget_if_forked(self) -> None:
        """In a fork of the process that started the child (`tasks check --workers`, a forked
        evaluation worker), the child is the parent's: it cannot be polled from here
        (`multiprocessing` asserts "can only test a child process": every grading an
        infrastructure error) nor killed. This process drops its copy of the pipe, leaves the
        parent's child alone, and starts its own."""
        if self.proc is not None and self.owner != os.getpid():
            self._conn.close()
            self.proc = self._conn = None

    def stop(self) -> None:
        self._forget_if_forked()
        if self.proc is not None:
            self.proc.kill()
            self.proc.join(5)
            self._conn.close()
        self.proc = self._conn = None

    def _once(self, request: Any, timeout_s: float) -> tuple[str, Any]:
        self._forget_if_forked()
        if self.proc is None or not self.proc.is_alive():
            self._start()
        self._conn.send(request)
        if not self._conn.poll(timeout_s):
            self.stop()
            return "timeout", None
        return self._conn.recv()

    def call(self, request: Any, timeout_s: float) -> tuple[str, Any]:
        try:
            return self._once(request, timeout_s)
        except (EOFError, OSError):
            self.stop()  # died: a fresh child (ready, so its start is sound) gets it again
        try:
            return self._once(request, timeout_s)
        except (EOFError, OSError) as e:
            self.stop()
            raise AnswerKilledWorker(f"the {self._name} process died twice on this input "
                                     f"({type(e).__name__})") from e


class GradingWorker:
    """Up to `size` grading child processes, shared by the threads of this process: a call takes
    an idle one (so one answer that runs to its timeout holds up one child, not every grading).

    In a child, `setup()` runs once (imports, caches) and `handle(state, request)` answers each
    request. `call(request, timeout_s)` returns ("ok", answer), ("raised", "Error: message") where
    `handle` raised, or ("timeout", None) where the call outlived `timeout_s` (that child is
    killed). Both functions must be importable by name (the children are `spawn`ed). Children
    start on first use: a process that grades from one thread starts one."""

    def __init__(self, setup: Callable[[], Any], handle: Callable[[Any, Any], Any], name: str,
                 size: int | None = None) -> None:
        self._size = size or DEFAULT_SIZE
        self._idle: queue.LifoQueue[_Child] = queue.LifoQueue()
        for _ in range(self._size):
            self._idle.put(_Child(setup, handle, name))
        self._children = list(self._idle.queue)

    def call(self, request: Any, timeout_s: float) -> tuple[str, Any]:
        child = self._idle.get()  # the most recently used first: a started one where there is one
        try:
            return child.call(request, timeout_s)
        finally:
            self._idle.put(child)

    def judged(self, request: Any, timeout_s: float) -> tuple[Any, str | None]:
        """`call` as a grader reads it: (answer, None), or (None, why the input fails) where the
        handler raised, the call outlived `timeout_s` or the input killed the child twice --
        each the input's doing, so a failed verdict, never an infrastructure error."""
        try:
            status, result = self.call(request, timeout_s)
        except AnswerKilledWorker as e:
            return None, str(e)
        if status == "timeout":
            return None, f"took longer than {timeout_s:g}s"
        if status == "raised":
            return None, f"raised {result}"
        return result, None

    def pids(self) -> list[int]:
        """The running children's pids (this process's own)."""
        return [c.proc.pid for c in self._children if c.proc is not None and c.owner == os.getpid()]

    def close(self) -> None:
        for _ in range(self._size):
            self._idle.get().stop()
        for c in self._children:
            self._idle.put(c)
