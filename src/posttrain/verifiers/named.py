"""Verifiers usable by name with parameters, for domains written as data rather than code.

A data source (`posttrain.tasks.sources`) names its verifier and gives parameters:

    [verifier]
    name = "numeric"
    rel_tol = 1e-3

`VERIFIERS[name]` says which parameters a verifier takes (each one also settable per row from a
column, see `posttrain.tasks.sources.data`), which are required, whether answers span several lines,
how a reference value becomes the task's reference and the oracle's answer, and how to make a
plausible *wrong* answer from a right one (the self-check's generated negative). The verifiers
are the existing classes where one exists (exact, numeric, json, unit-tests, script); the new
ones here are small: normalized text and regular expressions (math equivalence is
`posttrain.verifiers.mathexpr`).
"""

from __future__ import annotations

import json
import math
import re
import unicodedata
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from posttrain.values.verdict import Verdict
from posttrain.verifiers.answer import NUMERIC, ExactMatch, default_rel_tol, parse_number, reference_answer
from posttrain.verifiers.base import Outcome, Verifier, VerifierError, verdict
from posttrain.verifiers.code import UnitTestVerifier
from posttrain.verifiers.mathexpr import MATH
from posttrain.verifiers.script import SCRIPT
from posttrain.verifiers.structured import StructuredAnswer

REGEX_TIMEOUT_S = 1.0
"""a pattern that backtracks longer than this on an answer fails it (the answer caused it)"""


_NUMBER_TOKEN = re.compile(r"(?<!\w)[-+]?\d+(?:[.,/:]\d+)*|\d+(?:[.,/:]\d+)*")


def _no_punctuation(text: str) -> str:
    return "".join(" " if unicodedata.category(c).startswith("P") else c for c in text)


def normalize_text(text: str, *, strip_punctuation: bool = True, drop_articles: bool = False) -> str:
    """NFKC, case-folded, punctuation removed (optionally English articles too), whitespace runs
    collapsed: the usual normalisation of short free-text answers (as in SQuAD's scorer).

    Punctuation that is part of a number is kept: a sign before it, and `.`, `,`, `/`, `:`
    between its digits (SQuAD's normalisation made `-3` equal `3`, `1.5` equal `1 5` and `3,5`
    equal `3.5`)."""
    text = unicodedata.normalize("NFKC", text).casefold()
    if strip_punctuation:
        parts, last = [], 0
        for m in _NUMBER_TOKEN.finditer(text):
            parts += [_no_punctuation(text[last:m.start()]), f" {m.group()} "]
            last = m.end()
        text = "".join([*parts, _no_punctuation(text[last:])])
    words = text.split()
    if drop_articles:
        words = [w for w in words if w not in ("a", "an", "the")]
    return " ".join(words)


@dataclass(frozen=True)
class NormalizedText:
    """Passes iff answer and reference are equal after `normalize_text`.

    `task.verifier` settings: `strip_punctuation` (default true), `drop_articles` (default false).
    """

    name: str = "normalized"
    version: str = "2"
    needs_sandbox: bool = False

    def verify(self, task: Any, outcome: Outcome) -> Verdict:
        want = reference_answer(task.reference, task.key)
        opts = {"strip_punctuation": bool(task.verifier.get("strip_punctuation", True)),
                "drop_articles": bool(task.verifier.get("drop_articles", False))}
        got = normalize_text(outcome.answer or "", **opts)
        if not got:
            return verdict(self, False, reason="empty answer")
        if got != normalize_text(str(want), **opts):
            return verdict(self, False, reason="mismatch", got=got[:200])
        return verdict(self, True)


@dataclass(frozen=True)
class RegexMatch:
    """Passes iff the whole answer (stripped) matches a regular expression.

    `task.verifier` settings: `pattern` (required; Python `re` syntax, through the `regex`
    library for its timeout), `ignore_case` (default false), `dotall` (default false). The
    reference answer is not compared: it is one answer known to match (the oracle).
    """

    name: str = "regex"
    version: str = "1"
    needs_sandbox: bool = False

    def verify(self, task: Any, outcome: Outcome) -> Verdict:
        import regex

        pattern = task.verifier.get("pattern")
        if not isinstance(pattern, str) or not pattern:
            raise VerifierError(f"task {task.key}: the regex verifier needs a 'pattern'")
        flags = (regex.IGNORECASE if task.verifier.get("ignore_case") else 0) | \
                (regex.DOTALL if task.verifier.get("dotall") else 0)
        try:
            compiled = regex.compile(pattern, flags | regex.VERSION0)
        except regex.error as e:
            raise VerifierError(f"task {task.key}: invalid pattern {pattern!r}: {e}") from e
        answer = (outcome.answer or "").strip()
        if not answer:
            return verdict(self, False, reason="empty answer")
        try:
            ok = compiled.fullmatch(answer, timeout=REGEX_TIMEOUT_S) is not None
        except TimeoutError:
            return verdict(self, False, reason=f"matching took longer than {REGEX_TIMEOUT_S:g}s")
        extra: dict[str, Any] = {} if ok else {"reason": "no match", "got": answer[:200]}
        return verdict(self, ok, **extra)


# -- negatives: a plausible wrong answer made from a right one ----------------------------------

def _wrong_text(answer: Any, settings: Mapping[str, Any]) -> str:
    return f"{answer} x" if str(answer).strip() else "x"


def _wrong_number(answer: Any, settings: Mapping[str, Any]) -> str:
    want = parse_number(str(answer))
    rel, abs_ = float(settings.get("rel_tol", default_rel_tol(answer))), float(settings.get("abs_tol", 1e-9))
    step = max(1.0, 10 * abs_, abs(want) * max(0.5, 10 * rel))  # well outside the tolerance
    wrong = want + step
    return str(int(wrong)) if wrong == int(wrong) and abs(wrong) < 1e15 else repr(wrong)


def _wrong_math(answer: Any, settings: Mapping[str, Any]) -> str:
    inner = str(answer).strip().strip("$")
    if inner.startswith("\\boxed{") and inner.endswith("}"):
        inner = inner[len("\\boxed{"):-1]
    return f"\\boxed{{({inner})+1}}"  # boxed: what math-verify extracts first


def _wrong_json(answer: Any, settings: Mapping[str, Any]) -> str:
    """The answer with its first leaf value changed (a number moved far outside any tolerance)."""
    def change(v: Any) -> tuple[Any, bool]:
        if isinstance(v, bool):
            return (not v), True
        if isinstance(v, (int, float)):
            return v + max(1, abs(v)) * 2 + 1, True
        if isinstance(v, str):
            return v + "x", True
        if isinstance(v, dict):
            for k in v:
                new, done = change(v[k])
                if done:
                    return {**v, k: new}, True
        if isinstance(v, list):
            for i, x in enumerate(v):
                new, done = change(x)
                if done:
                    return v[:i] + [new] + v[i + 1:], True
        return v, False

    changed, done = change(answer)
    return json.dumps(changed if done else {"not": answer})


def _wrong_code(answer: Any, settings: Mapping[str, Any]) -> str:
    entry = settings.get("entry_point") or "solution"
    return f"def {entry}(*args, **kwargs):\n    return None\n"


def _json_reference(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError as e:
            raise ValueError(f"not JSON: {e.msg} (column {e.colno})") from None
    return value


def _number_reference(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"not a number: {value!r:.60}")
    parse_number(str(value))  # raises ValueError saying why
    return value


def _text_reference(value: Any) -> Any:
    if isinstance(value, (dict, list)) or value is None or isinstance(value, bool):
        raise ValueError(f"expected a string or a number, got {type(value).__name__}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"not a finite value: {value!r}")
    return value if isinstance(value, str) else str(value)


@dataclass(frozen=True)
class NamedVerifier:
    """A verifier as a data source uses it."""

    verifier: Verifier
    params: Mapping[str, tuple[type | tuple[type, ...], str]]
    """parameter -> (accepted types, what it is); they become the task's `verifier` settings"""
    wrong: Callable[[Any, Mapping[str, Any]], str]
    """(reference answer, settings) -> a plausible wrong answer (a generated negative)"""
    reference: Callable[[Any], Any] = _text_reference
    """checks and converts an answer-column value into the reference answer (ValueError: why not)"""
    oracle: Callable[[Any], str] = str
    """the reference answer as the answer text the verifier should accept"""
    required: tuple[str, ...] = ()
    multiline: bool = False
    """answers span several lines (code, JSON): the completion is not cut at a newline"""
    fixed: Mapping[str, Any] = field(default_factory=dict)
    """settings every task gets (not parameters)"""
    answer_in_args: bool = False
    """the reference answer also goes to the check as `args['expected']` (the script verifier
    never sees `task.reference`)"""

    def settings(self, params: Mapping[str, Any], where: str) -> dict[str, Any]:
        """Validated settings; raises ValueError naming `where` and the parameter."""
        out = dict(self.fixed)
        for key, value in params.items():
            if key not in self.params:
                known = ", ".join(sorted(self.params)) or "none"
                raise ValueError(f"{where}: verifier.{key}: unknown parameter of the "
                                 f"{self.verifier.name!r} verifier (known: {known})")
            types = self.params[key][0]
            ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in
                                                   (types if isinstance(types, tuple) else (types,)))
            if not ok:
                names = " or ".join(t.__name__ for t in (types if isinstance(types, tuple) else (types,)))
                raise ValueError(f"{where}: verifier.{key}: expected {names}, got {value!r:.60}")
            out[key] = value
        return out


_NUM = (int, float)

VERIFIERS: dict[str, NamedVerifier] = {
    "exact": NamedVerifier(ExactMatch(), {
        "case_sensitive": (bool, "letter case must match (default true)"),
        "collapse_whitespace": (bool, "inner runs of whitespace compare as one space (default false)")},
        wrong=_wrong_text),
    "normalized": NamedVerifier(NormalizedText(), {
        "strip_punctuation": (bool, "ignore punctuation (default true)"),
        "drop_articles": (bool, "ignore a/an/the (default false)")},
        wrong=_wrong_text),
    "numeric": NamedVerifier(NUMERIC, {
        "rel_tol": (_NUM, "relative tolerance (default 1e-6; 0 for an integer reference)"),
        "abs_tol": (_NUM, "absolute tolerance (default 1e-9)")},
        wrong=_wrong_number, reference=_number_reference),
    "regex": NamedVerifier(RegexMatch(), {
        "pattern": (str, "the regular expression the whole answer must match"),
        "ignore_case": (bool, "case-insensitive (default false)"),
        "dotall": (bool, "'.' matches newlines too (default false)")},
        wrong=_wrong_text, required=("pattern",)),
    "json": NamedVerifier(StructuredAnswer(), {
        "schema": (dict, "a JSON Schema (draft 2020-12) the answer must satisfy"),
        "tolerance": (dict, "{rel, abs} for every number (default exact)"),
        "field_tolerance": (dict, "per-field {rel, abs} by path or last key"),
        "consistency": (list, "rules the numbers must satisfy (see posttrain.verifiers.structured)")},
        wrong=_wrong_json, reference=_json_reference, oracle=json.dumps, multiline=True),
    "unit-tests": NamedVerifier(UnitTestVerifier(), {
        "entry_point": (str, "the function under test"),
        "test": (str, "Python source defining check(candidate), HumanEval style"),
        "stub": (str, "source run before the candidate's (a prompt the answer completes)"),
        "timeout_s": (_NUM, "wall budget of the candidate's tests (default 6)")},
        wrong=_wrong_code, required=("entry_point", "test"), multiline=True, fixed={"mode": "check"}),
    "script": NamedVerifier(SCRIPT, {
        "check": (str, "Python source defining check(answer, args) -> bool | {'passed': bool}; "
                       "args['expected'] is the answer column"),
        "args": (dict, "more hidden values for the check (beside 'expected')"),
        "timeout_s": (_NUM, "wall budget of the check (default 20)")},
        wrong=_wrong_text, required=("check",), answer_in_args=True),
    "math": NamedVerifier(MATH, {
        "float_rounding": (int, "decimals kept when comparing floats (default 6)"),
        "timeout_s": (_NUM, "wall budget of one grading (default 5)")},
        wrong=_wrong_math),
}


def named_verifier(name: str, where: str = "") -> NamedVerifier:
    try:
        return VERIFIERS[name]
    except KeyError:
        raise ValueError(f"{where + ': ' if where else ''}verifier.name: unknown verifier {name!r} "
                         f"(known: {', '.join(sorted(VERIFIERS))})") from None
