"""A verifier's verdict is held to its contract before anything trains on it: `passed` a bool,
`score` a finite number in [0, 1]. A broken one is a failed verdict scored 0 with what the
verifier said kept (the answer may have drawn it out), a non-verdict is an infrastructure error,
and `tasks check` fails the domain either way."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest

from posttrain.policies.scripted import ScriptedPolicy
from posttrain.scheduling.domain_check import check_domains
from posttrain.scheduling.engine import run_episodes
from posttrain.values.verdict import Verdict
from posttrain.verifiers.base import INVALID_SCORE, VerifierError, held_to_contract, verdict
from tests.toydomains import ExactVerifier, add_domain


class _Truthy:
    """What a candidate's object passed through as `passed` could be: true whatever it is."""

    def __bool__(self) -> bool:
        return True


@dataclass(frozen=True)
class _Unbounded:
    """Right answers score 1; a wrong one scores what `wrong` says (a formula gone astray)."""

    wrong: object
    name: str = "unbounded"
    version: str = "1"
    needs_sandbox: bool = False

    def verify(self, task, outcome) -> Verdict:
        if outcome.answer == task.reference:
            return verdict(self, True)
        return Verdict(passed=False, score=self.wrong, details={"got": outcome.answer},  # type: ignore[arg-type]
                       verifier_version="unbounded@1")


V = ExactVerifier()


def test_a_verdict_that_keeps_the_contract_is_passed_through_unchanged():
    for v in (verdict(V, True), verdict(V, False), verdict(V, True, 0.25, why="partial"),
              Verdict(passed=False, score=0.0)):
        assert held_to_contract(V, v) is v
    # numpy's bool and float and an int score mean what they say: normalised, not failed
    v = held_to_contract(V, Verdict(passed=np.bool_(True), score=np.float64(1.0)))  # type: ignore[arg-type]
    assert v.passed is True and type(v.score) is float and v.score == 1.0 and INVALID_SCORE not in v.details
    assert held_to_contract(V, Verdict(passed=True, score=1)).score == 1.0  # type: ignore[arg-type]


@pytest.mark.parametrize("passed, score", [
    (True, math.nan), (True, math.inf), (False, -math.inf), (True, 1.5), (False, -0.25), (True, 1e9),
    (_Truthy(), 1.0), (1, 1.0), (True, "1"), (True, None), (True, True),
])
def test_a_broken_verdict_is_a_failure_scored_0_with_what_the_verifier_said(passed, score):
    v = held_to_contract(V, Verdict(passed=passed, score=score, details={"got": "x"}, verifier_version="v@1"))
    assert v.passed is False and v.score == 0.0 and v.verifier_version == "v@1"
    assert v.details["got"] == "x" and f"score={score!r}"[:40] in v.details[INVALID_SCORE]
    assert "scored 0" in v.details["reason"]


def test_no_verdict_at_all_is_the_verifiers_infrastructure_failure():
    for returned in (None, 1.0, True, {"passed": True, "score": 1.0}):
        with pytest.raises(VerifierError, match="not a Verdict"):
            held_to_contract(V, returned)


def test_an_episode_whose_verifier_breaks_the_contract_trains_on_0_not_nan():
    """Through the engine: the wrong answer's nan (or 1e9) is a completed episode with reward 0,
    never nan in the advantages and never an infrastructure error retried forever; the oracle's
    right answer still scores 1."""
    for wrong in (math.nan, 1e9):
        domain = add_domain("toy.unbounded", _Unbounded(wrong))
        tasks = [(domain, domain.task(i)) for i in range(3)]
        bad = run_episodes(tasks, ScriptedPolicy.negative("wrong"))
        assert [t.status for t in bad] == ["completed"] * 3
        assert all(t.reward == 0.0 and not t.passed for t in bad)
        assert all(INVALID_SCORE in t.verdict.details for t in bad)
        good = run_episodes(tasks, ScriptedPolicy.oracle())
        assert all(t.reward == 1.0 and t.passed for t in good)


def test_tasks_check_fails_a_domain_whose_verifier_breaks_the_contract():
    report = check_domains([add_domain("toy.unbounded", _Unbounded(math.nan))], per_domain=2)
    kinds = {f.kind for f in report.failures}
    assert not report.ok and "invalid_score" in kinds and "oracle_failed" not in kinds
    detail = next(f.detail for f in report.failures if f.kind == "invalid_score")
    assert "score=nan" in detail
    # the control: the same domain with a verifier that keeps the contract passes
    assert check_domains([add_domain("toy.bounded", _Unbounded(0.0))], per_domain=2).ok
