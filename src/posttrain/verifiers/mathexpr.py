"""The `math` verifier: mathematical equivalence of the answer and the reference, by `math-verify`.

`math-verify` (Hugging Face's library, on sympy) extracts the final answer from the completion
(`\\boxed{..}`, LaTeX, or a plain expression; "The answer is \\boxed{0.5}" works) and decides
equivalence symbolically and numerically ("1/2" = "0.5" = "\\frac{2}{4}"). No parsing is written
here.

Grading runs in a child process (`posttrain.verifiers.worker`): sympy can run for ever on an
answer such as `\\boxed{9^{9^{9^9}}}`, and math-verify's own timeout uses `signal.alarm`, which
works only in a process's main thread (episodes are graded on worker threads). A grading that
outlives `timeout_s` fails the answer; so does one that kills the child twice.

Against a policy that hedges: the answer is read once (as LaTeX where it has markup, else as
text; the other reading only where that finds nothing), so no answer passes two references;
and an inequality is no value (`x \\neq 3`, `x > 3` fail for 3). Not refused: an unevaluated
expression of the right value (`37+48` for 85: equivalence is the point of this verifier; use
`numeric` or `exact` where the task is to compute) and math-verify's percentages (`3%` for 3).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from posttrain.values.verdict import Verdict
from posttrain.verifiers.base import Outcome, VerifierError, verdict
from posttrain.verifiers.worker import GradingWorker

MAX_ANSWER_CHARS = 4000
"""longer answers are refused before parsing (a failed verdict)"""

DEFAULT_TIMEOUT_S = 5.0


def _latex(text: str) -> str:
    """Bare LaTeX ("x^2+1", "\\sqrt{2}") in math delimiters: math-verify extracts LaTeX only from
    delimited or boxed text."""
    return text if "$" in text or "\\boxed" in text else f"${text}$"


def _setup() -> Any:
    import logging

    logging.getLogger("math_verify").setLevel(logging.ERROR)  # "timeout is disabled": ours applies
    import math_verify

    return math_verify


def _grade(math_verify: Any, request: tuple[str, str, int]) -> tuple[Any, str]:
    """In the grading child: (gold, answer, float_rounding) -> (passed or "bad_gold", detail)."""
    parse, verify = math_verify.parse, math_verify.verify
    gold, answer, rounding = request
    g = parse(_latex(gold), parsing_timeout=None) or parse(gold, parsing_timeout=None)
    if not g:
        return "bad_gold", f"math-verify finds no expression in the reference {gold!r:.80}"
    # One reading of the answer, never the better of two: with markup, as LaTeX (bare LaTeX in
    # $..$); plain text as written (math-verify takes its last number or expression). Two
    # readings let one answer pass two references (`3 \\text{ (or 4)}` read 3 as LaTeX and 4
    # as text). The other reading only where the first finds nothing (`\\sqrt{2}` as text).
    latex_first = _marked_up(answer) or plain_relation(answer)  # `x > 3` as text reads 3
    first, second = (_latex(answer.strip()), answer) if latex_first else (answer, _latex(answer.strip()))
    a = parse(first, parsing_timeout=None) or parse(second, parsing_timeout=None)
    if not a:
        return False, "no mathematical expression found in the answer"
    if _relation(a[0]) and not _relation(g[0]):
        return False, f"a relation is not a value: got {str(a[0])[:80]}"
    ok = bool(verify(g, a, float_rounding=rounding, timeout_seconds=None))
    return ok, "" if ok else f"not equivalent: got {str(a[-1])[:80]}"


def _relation(expr: Any) -> bool:
    """An inequality (`x \\neq 3`, `x > 3`, also inside a set): math-verify compares its right
    side with the reference, so `x \\neq 3` passed for 3."""
    from sympy import Eq, FiniteSet  # type: ignore[import-untyped]
    from sympy.core.relational import Relational  # type: ignore[import-untyped]

    if isinstance(expr, FiniteSet):
        return any(_relation(e) for e in expr.args)
    return isinstance(expr, Relational) and not isinstance(expr, Eq)


_MARKUP = re.compile(r"[\\$^{}]")
_TAGS = re.compile(r"</?[A-Za-z][^<>]*>")
_PLAIN_RELATION = re.compile(r"[\w)]\s*(?:[<>]=?|!=|[≠≤≥])\s*[\w(-]")


def _marked_up(answer: str) -> bool:
    return _MARKUP.search(answer) is not None


def plain_relation(answer: str) -> bool:
    """A relation written as text (`x > 3`, `x != 3`, `2 < 3`): its last number is no value."""
    return _PLAIN_RELATION.search(_TAGS.sub(" ", answer)) is not None


_WORKER = GradingWorker(_setup, _grade, "posttrain-math-verify")


@dataclass(frozen=True)
class MathEquivalence:
    """Passes iff math-verify finds the answer equivalent to the reference (see the module).

    `task.verifier` settings: `float_rounding` (default 6: decimals kept when comparing floats),
    `timeout_s` (default 5: wall budget of one grading).
    """

    name: str = "math"
    version: str = "2"
    needs_sandbox: bool = False

    def verify(self, task: Any, outcome: Outcome) -> Verdict:
        from posttrain.verifiers.answer import reference_answer

        gold = str(reference_answer(task.reference, task.key))
        if outcome.answer is None or not outcome.answer.strip():
            return verdict(self, False, reason="empty answer")
        if len(outcome.answer) > MAX_ANSWER_CHARS:
            return verdict(self, False, reason=f"answer longer than {MAX_ANSWER_CHARS} characters")
        if not _marked_up(outcome.answer) and plain_relation(outcome.answer) and not plain_relation(gold):
            return verdict(self, False, reason="a relation is not a value")
        rounding = int(task.verifier.get("float_rounding", 6))
        timeout = float(task.verifier.get("timeout_s", DEFAULT_TIMEOUT_S))
        result, why = _WORKER.judged((gold, outcome.answer, rounding), timeout)
        if why is not None:  # an answer sympy chokes on is a wrong answer
            return verdict(self, False, reason=f"could not evaluate the answer: {why}")
        ok, detail = result
        if ok == "bad_gold":
            raise VerifierError(f"task {task.key}: {detail}")
        extra: dict[str, Any] = {"reason": detail} if detail else {}
        return verdict(self, bool(ok), **extra)


MATH = MathEquivalence()
