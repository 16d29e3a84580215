"""Edge cases of the exact and numeric verifiers: whitespace, unicode, NaN/inf, huge numbers."""

from __future__ import annotations

import pytest

from posttrain.values.task import Task
from posttrain.verifiers.answer import EXACT, NUMERIC, parse_number
from posttrain.verifiers.base import Outcome, VerifierError


def _task(reference, **verifier) -> Task:
    return Task(domain="t.x", prompt="p", reference=reference, verifier=verifier, seed=0)


def _ok(verifier, task, answer) -> bool:
    return verifier.verify(task, Outcome(answer=answer)).passed


def test_exact_strips_surrounding_whitespace_only():
    task = _task({"answer": "ab c"})
    assert _ok(EXACT, task, " ab c\n") and not _ok(EXACT, task, "ab  c")
    assert _ok(EXACT, _task("ab c", collapse_whitespace=True), "ab   c")
    assert not _ok(EXACT, task, "") and not _ok(EXACT, task, None) and not _ok(EXACT, task, "AB C")
    assert _ok(EXACT, _task("ab c", case_sensitive=False), "AB C")


def test_exact_normalises_unicode_and_stamps_version():
    decomposed, composed = "cafe\u0301", "caf\u00e9"
    result = EXACT.verify(_task(composed), Outcome(answer=decomposed))
    assert result.passed and result.verifier_version == "exact@1" and result.score == 1.0
    failed = EXACT.verify(_task("x"), Outcome(answer="\u0000\U0001f600"))
    assert not failed.passed and failed.score == 0.0 and failed.details["reason"] == "mismatch"


def test_exact_without_reference_is_an_infra_error():
    with pytest.raises(VerifierError, match="no reference"):
        EXACT.verify(_task(None), Outcome(answer="1"))
    with pytest.raises(VerifierError, match="'answer'"):
        EXACT.verify(_task({"value": 1}), Outcome(answer="1"))


@pytest.mark.parametrize("text", ["nan", "NaN", "inf", "-inf", "Infinity", "1e999", "-1e400",
                                  "9" * 5000, "1/2", "85 apples", "0x10", "", "   ", "1,00", "--1",
                                  "\u0668\u0665", "1_000", "+"])
def test_numeric_refuses_malformed_without_crashing(text):
    task = _task("85")
    result = NUMERIC.verify(task, Outcome(answer=text))
    assert not result.passed and result.details["reason"].startswith(("malformed", "outside"))
    with pytest.raises(ValueError):
        parse_number(text)


@pytest.mark.parametrize("text,value", [("85", 85.0), (" 85.0 ", 85.0), ("+85", 85.0), ("8.5e1", 85.0),
                                        ("1,234,567.5", 1234567.5), (".5", 0.5), ("-3", -3.0)])
def test_numeric_parses_plain_literals(text, value):
    assert parse_number(text) == value


def test_numeric_tolerance_is_max_of_relative_and_absolute():
    task = _task({"answer": "100"}, rel_tol=0.01, abs_tol=0.0)
    assert _ok(NUMERIC, task, "100.99") and not _ok(NUMERIC, task, "101.01")
    task = _task({"answer": "0"}, rel_tol=0.01, abs_tol=0.5)
    assert _ok(NUMERIC, task, "-0.5") and not _ok(NUMERIC, task, "0.6")
    huge = _task({"answer": "1e308"}, rel_tol=1e-6)
    assert _ok(NUMERIC, huge, "1.0000001e308") and not _ok(NUMERIC, huge, "-1e308")


def test_numeric_bad_reference_or_tolerance_is_an_infra_error():
    with pytest.raises(VerifierError, match="not a number"):
        NUMERIC.verify(_task("eighty"), Outcome(answer="80"))
    with pytest.raises(VerifierError, match="tolerances"):
        NUMERIC.verify(_task("1", rel_tol=-1), Outcome(answer="1"))


def test_verification_is_deterministic():
    task = _task({"answer": "2.5"}, abs_tol=0.01)
    a = NUMERIC.verify(task, Outcome(answer="2.505"))
    b = NUMERIC.verify(task, Outcome(answer="2.505"))
    assert a == b and a.passed
