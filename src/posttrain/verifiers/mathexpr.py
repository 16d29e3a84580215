"""The `math` verifier: mathematical equivalence of the answer and the reference, by `math-verify`.

`math-verify` (Hugging Face's library, on sympy) extracts the final answer from the completion
(`\\boxed{..}`, LaTeX, or a plain expression; "The answer is \\boxed{0.5}" works) and decides
equivalence symbolically and numerically ("1/2" = "0.5" = "\\frac{2}{4}"). No parsing is written
here.

Why a worker process: sympy can run for ever on an answer such as `\\boxed{9^{9^{9^9}}}`, and
math-verify's own timeout uses `signal.alarm`, which works only in a process's main thread
(episodes are graded on worker threads). So grading runs in one long-lived child process
(`spawn`ed: it imports only math-verify), and a grading that outlives `timeout_s` kills that child
(a fresh one starts on the next call) and fails the answer: the answer is what made it too costly
to evaluate. A child that dies otherwise, or cannot start, is a `VerifierError`.
"""

from __future__ import annotations

import multiprocessing
import threading
from dataclasses import dataclass
from typing import Any

from posttrain.values.verdict import Verdict
from posttrain.verifiers.base import Outcome, VerifierError, verdict

MAX_ANSWER_CHARS = 4000
"""longer answers are refused before parsing (a failed verdict)"""

DEFAULT_TIMEOUT_S = 5.0


def _latex(text: str) -> str:
    """Bare LaTeX ("x^2+1", "\\sqrt{2}") in math delimiters: math-verify extracts LaTeX only from
    delimited or boxed text."""
    return text if "$" in text or "\\boxed" in text else f"${text}$"


def _serve(conn: Any) -> None:  # the child: (gold, answer, float_rounding) in, (ok, detail) out
    import logging

    logging.getLogger("math_verify").setLevel(logging.ERROR)  # "timeout is disabled": ours applies
    from math_verify import parse, verify

    while True:
        try:
            gold, answer, rounding = conn.recv()
        except EOFError:
            return
        try:
            g = parse(_latex(gold), parsing_timeout=None) or parse(gold, parsing_timeout=None)
            if not g:
                conn.send(("bad_gold", f"math-verify finds no expression in the reference {gold!r:.80}"))
                continue
            # the answer as written (a plain expression, or LaTeX in $..$ / \\boxed{}), then as LaTeX
            found, ok = None, False
            for text in dict.fromkeys((answer, _latex(answer.strip()))):
                a = parse(text, parsing_timeout=None)
                if a:
                    found = found or a
                    if verify(g, a, float_rounding=rounding, timeout_seconds=None):
                        ok = True
                        break
            if found is None:
                conn.send((False, "no mathematical expression found in the answer"))
            else:
                conn.send((ok, "" if ok else f"not equivalent: got {str(found[-1])[:80]}"))
        except Exception as e:  # noqa: BLE001 - an answer sympy chokes on is a wrong answer
            conn.send((False, f"could not evaluate the answer: {type(e).__name__}"))


class _Worker:
    """One grading child process at a time, shared by the threads of this process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: Any = None
        self._conn: Any = None
        self._warm = False
        """whether the child has answered once (its first call pays its start and imports)"""

    def _start(self) -> None:
        ctx = multiprocessing.get_context("spawn")
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_serve, args=(child,), daemon=True, name="posttrain-math-verify")
        proc.start()
        child.close()
        self._proc, self._conn, self._warm = proc, parent, False

    def _stop(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.join(5)
            self._conn.close()
        self._proc = self._conn = None

    def grade(self, gold: str, answer: str, rounding: int, timeout_s: float) -> tuple[Any, str]:
        with self._lock:
            if self._proc is None or not self._proc.is_alive():
                self._start()
            try:
                self._conn.send((gold, answer, rounding))
                if not self._conn.poll(timeout_s + (0.0 if self._warm else 30.0)):
                    self._stop()
                    return None, f"evaluating the answer took longer than {timeout_s:g}s"
                self._warm = True
                return self._conn.recv()
            except (EOFError, OSError, BrokenPipeError) as e:
                self._stop()
                raise VerifierError(f"the math-verify worker process died: {type(e).__name__}: {e}") from e


_WORKER = _Worker()


@dataclass(frozen=True)
class MathEquivalence:
    """Passes iff math-verify finds the answer equivalent to the reference (see the module).

    `task.verifier` settings: `float_rounding` (default 6: decimals kept when comparing floats),
    `timeout_s` (default 5: wall budget of one grading).
    """

    name: str = "math"
    version: str = "1"
    needs_sandbox: bool = False

    def verify(self, task: Any, outcome: Outcome) -> Verdict:
        from posttrain.verifiers.answer import reference_answer

        gold = str(reference_answer(task.reference, task.key))
        if outcome.answer is None or not outcome.answer.strip():
            return verdict(self, False, reason="empty answer")
        if len(outcome.answer) > MAX_ANSWER_CHARS:
            return verdict(self, False, reason=f"answer longer than {MAX_ANSWER_CHARS} characters")
        rounding = int(task.verifier.get("float_rounding", 6))
        timeout = float(task.verifier.get("timeout_s", DEFAULT_TIMEOUT_S))
        ok, detail = _WORKER.grade(gold, outcome.answer, rounding, timeout)
        if ok == "bad_gold":
            raise VerifierError(f"task {task.key}: {detail}")
        if ok is None:
            return verdict(self, False, reason=detail)
        extra: dict[str, Any] = {"reason": detail} if detail else {}
        return verdict(self, bool(ok), **extra)


MATH = MathEquivalence()
