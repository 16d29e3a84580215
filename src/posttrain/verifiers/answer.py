"""Answer verifiers: exact strings and numbers within a tolerance.

Both read the expected answer from `task.reference`: either the answer itself (a string or a
number, as hand-written task files often have it) or a dict with an `"answer"` key (what the
generated families store, next to the problem's inputs). Settings come from `task.verifier`.

What they do *not* do: extract an answer from a longer completion ("The answer is 85." fails).
The single-answer environment stops the completion at a newline; these verifiers only strip
surrounding whitespace, so the policy must learn the exact output format.
"""

from __future__ import annotations

import math
import re
import unicodedata
from dataclasses import dataclass
from typing import Any

from posttrain.values.verdict import Verdict
from posttrain.verifiers.base import Outcome, VerifierError, verdict

MAX_NUMBER_CHARS = 64
"""longer numeric answers are refused as malformed (no big-int parsing, no OverflowError)"""

_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?", re.ASCII)


def reference_answer(task_reference: Any, task_key: str) -> Any:
    """The expected answer inside a task's reference (the value or `reference["answer"]`)."""
    if isinstance(task_reference, dict):
        if "answer" not in task_reference:
            raise VerifierError(f"task {task_key}: reference has no 'answer' field")
        return task_reference["answer"]
    if task_reference is None:
        raise VerifierError(f"task {task_key}: no reference answer")
    return task_reference


def _normalize_text(text: str, *, case_sensitive: bool, collapse_whitespace: bool) -> str:
    # NFC so that a precomposed "é" equals "e" + combining accent.
    text = unicodedata.normalize("NFC", text).strip()
    if collapse_whitespace:
        text = " ".join(text.split())
    if not case_sensitive:
        text = text.casefold()
    return text


@dataclass(frozen=True)
class ExactMatch:
    """Passes iff the answer equals the reference string after stripping surrounding whitespace.

    `task.verifier` settings: `case_sensitive` (default true), `collapse_whitespace` (default
    false: inner runs of whitespace must match too). Both sides are NFC-normalised.
    """

    name: str = "exact"
    version: str = "1"
    needs_sandbox: bool = False

    def verify(self, task, outcome: Outcome) -> Verdict:
        expected = reference_answer(task.reference, task.key)
        if not isinstance(expected, (str, int)) or isinstance(expected, bool):
            raise VerifierError(f"task {task.key}: exact reference must be a string or an integer, "
                                f"got {type(expected).__name__}")
        if outcome.answer is None:
            return verdict(self, False, reason="no answer")
        opts = {"case_sensitive": bool(task.verifier.get("case_sensitive", True)),
                "collapse_whitespace": bool(task.verifier.get("collapse_whitespace", False))}
        got = _normalize_text(outcome.answer, **opts)
        want = _normalize_text(str(expected), **opts)
        if not got:
            return verdict(self, False, reason="empty answer")
        if got != want:
            return verdict(self, False, reason="mismatch", got=got[:200])
        return verdict(self, True)


def parse_number(text: str) -> float:
    """A finite float from a plain decimal literal; raises ValueError saying why not.

    Accepts an optional sign, decimals and an exponent ("-3", "2.50", "1e3"), and thousands
    separators only in the form "1,234,567"; ASCII digits only. Refuses NaN, infinities,
    fractions, units, text, and literals over `MAX_NUMBER_CHARS` characters or beyond float range.
    """
    s = text.strip()
    if not s:
        raise ValueError("empty answer")
    if len(s) > MAX_NUMBER_CHARS:
        raise ValueError(f"number literal longer than {MAX_NUMBER_CHARS} characters")
    if re.fullmatch(r"[+-]?\d{1,3}(?:,\d{3})+(?:\.\d*)?", s, re.ASCII):
        s = s.replace(",", "")
    if not _NUMBER.fullmatch(s):
        raise ValueError(f"not a plain number: {s[:40]!r}")
    value = float(s)  # the regex admits only literals float() parses; overflow gives inf
    if not math.isfinite(value):
        raise ValueError(f"number out of range: {s[:40]!r}")
    return value


def default_rel_tol(reference: object) -> float:
    """`numeric`'s relative tolerance where the task sets none: 0 for a reference written as an
    integer (an off-by-one count is wrong however large), 1e-6 otherwise."""
    return 0.0 if re.fullmatch(r"\s*[+-]?[\d,]+\s*", str(reference)) else 1e-6


def within_tolerance(got: float, want: float, rel_tol: float, abs_tol: float) -> bool:
    """|got - want| <= max(abs_tol, rel_tol * |want|), computed without overflow."""
    diff = abs(got - want)  # both finite and < 1.8e308 in size, so diff may be inf only if huge
    return math.isfinite(diff) and diff <= max(abs_tol, rel_tol * abs(want))


@dataclass(frozen=True)
class NumericMatch:
    """Passes iff the answer is a number within tolerance of the reference number.

    Tolerance: `|got - want| <= max(abs_tol, rel_tol * |want|)`, from `task.verifier`
    (`rel_tol`, default 1e-6, but 0 where the reference is written as an integer: 1e-6 of
    12345678 let 12345679 pass; `abs_tol`, default 1e-9). A task whose prompt asks for a rounded
    answer (e.g. "to 2 decimals") sets `abs_tol` to half a unit of the last place plus a margin.
    The answer must be a plain number (see `parse_number`): "85 apples" fails, as do NaN and inf.
    """

    name: str = "numeric"
    version: str = "2"
    needs_sandbox: bool = False

    def verify(self, task, outcome: Outcome) -> Verdict:
        raw = reference_answer(task.reference, task.key)
        try:
            want = parse_number(str(raw))
        except ValueError as e:
            raise VerifierError(f"task {task.key}: reference {raw!r} is not a number: {e}") from e
        rel_tol = float(task.verifier.get("rel_tol", default_rel_tol(raw)))
        abs_tol = float(task.verifier.get("abs_tol", 1e-9))
        if not (rel_tol >= 0 and abs_tol >= 0 and math.isfinite(rel_tol) and math.isfinite(abs_tol)):
            raise VerifierError(f"task {task.key}: tolerances must be finite and >= 0, "
                                f"got rel_tol={rel_tol}, abs_tol={abs_tol}")
        if outcome.answer is None:
            return verdict(self, False, reason="no answer")
        try:
            got = parse_number(outcome.answer)
        except ValueError as e:
            return verdict(self, False, reason=f"malformed: {e}")
        if not within_tolerance(got, want, rel_tol, abs_tol):
            return verdict(self, False, reason="outside tolerance", got=got, want=want,
                           rel_tol=rel_tol, abs_tol=abs_tol)
        return verdict(self, True, got=got)


EXACT = ExactMatch()
NUMERIC = NumericMatch()
