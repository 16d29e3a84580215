"""reasoning-gym's scorers under attack: answers that run code, hang, or reach full credit
without being right fail, by class (`posttrain.tasks.families.rg_answers`)."""

from __future__ import annotations

import time

import pytest

from posttrain.tasks.families import reasoning_gym as rg
from posttrain.tasks.families.rg_answers import FORMS, evaluating_scorers, non_finite
from posttrain.verifiers.base import Outcome

DOMAINS = {d.name: d for d in rg.domains()}


def _grade(name: str, task, answer: str):
    return DOMAINS[name].verifier.verify(task, Outcome(answer=answer))


def test_every_scorer_that_evaluates_text_has_an_answer_form():
    from reasoning_gym.factory import DATASETS

    classes = {n: DATASETS[n][0] for n in DATASETS if n not in rg.SKIPPED}
    found = evaluating_scorers(classes)
    # the scan sees the known ones (it is not vacuous) ...
    assert {"binary_matrix", "countdown", "puzzle24", "simple_integration", "n_queens"} <= set(found)
    # ... and every generator it finds has a form
    assert set(found) <= set(FORMS), set(found) - set(FORMS)


@pytest.mark.parametrize("name", sorted(FORMS))
def test_code_in_an_answer_never_runs(name, tmp_path):
    task = DOMAINS[f"rg.{name}"].task(0)
    marker = tmp_path / "ran"
    for payload in (f"__import__('pathlib').Path('{marker}').write_text('x')",
                    f"(lambda: open('{marker}', 'w'))()",
                    "[c for c in ().__class__.__base__.__subclasses__()]"):
        result = _grade(f"rg.{name}", task, payload)
        assert not result.passed and "form" in result.details["reason"], result.details
    assert not marker.exists()


def test_a_patched_threshold_cannot_reach_later_answers():
    """An answer that (were it evaluated) sets our threshold to False would make every later
    wrong answer pass: it is refused by its form, and scoring happens in another process."""
    task = DOMAINS["rg.simple_integration"].task(0)
    patch = ("setattr(__import__('posttrain.tasks.families.reasoning_gym', fromlist=['_']), "
             "'PASS_THRESHOLD', False) or x")
    assert not _grade("rg.simple_integration", task, patch).passed
    gcd = DOMAINS["rg.gcd"].task(0)
    assert rg.PASS_THRESHOLD == 1.0
    assert not _grade("rg.gcd", gcd, str(int(gcd.reference["answer"]) + 7)).passed


@pytest.mark.slow
def test_restating_an_integral_is_no_answer():
    task = DOMAINS["rg.simple_integration"].task(0)
    integrand, var = task.reference["entry"]["metadata"]["integrand"], task.reference["entry"]["metadata"]["variable"]
    for restated in (f"Integral({integrand}, {var})", f"integrate({integrand}, {var})"):
        assert not _grade("rg.simple_integration", task, restated).passed
    assert _grade("rg.simple_integration", task, task.reference["answer"]).passed
    d = DOMAINS["rg.intermediate_integration"]  # items sympy could not integrate are never drawn
    assert all("Integral" not in d.task(s, split).reference["answer"] for s in range(30) for split in ("train", "eval"))


@pytest.mark.slow
def test_an_answer_that_takes_for_ever_fails_and_the_next_one_is_scored(monkeypatch):
    monkeypatch.setattr(rg, "RG_TIMEOUT_S", 3.0)
    task = DOMAINS["rg.simple_integration"].task(0)
    var = task.reference["entry"]["metadata"]["variable"]
    t0 = time.monotonic()
    bomb = _grade("rg.simple_integration", task, f"{var}**9**9**9**9 + C")
    assert time.monotonic() - t0 < 60
    assert not bomb.passed and "longer than 3s" in bomb.details["reason"]
    assert _grade("rg.simple_integration", task, task.reference["answer"]).passed


def test_puzzle24_and_countdown_must_make_the_target_exactly_from_the_given_numbers():
    p = DOMAINS["rg.puzzle24"].task(0)
    a, b, c, d = p.reference["entry"]["metadata"]["numbers"]
    assert _grade("rg.puzzle24", p, p.reference["answer"]).passed
    no_digits = f"len('')*{a}*{b}*{c}*{d} + len('{'x' * 24}')"  # digits right, 24 from len()
    assert not _grade("rg.puzzle24", p, no_digits).passed
    other = DOMAINS["rg.puzzle24"].task(1).reference["answer"]  # 24 from other numbers
    assert not _grade("rg.puzzle24", p, other).passed
    # 24.5 truncates to 24 in the scorer: [7, 4, 5, 9] -> (7/4)*(5+9)
    near = p.model_copy(update={"reference": {**p.reference, "entry": {
        **p.reference["entry"], "metadata": {**p.reference["entry"]["metadata"], "numbers": [7, 4, 5, 9]}}}})
    result = _grade("rg.puzzle24", near, "(7/4)*(5+9)")
    assert not result.passed and result.details.get("rg_score") == 1.0  # the scorer alone passed it
    cd = DOMAINS["rg.countdown"].task(0)
    assert _grade("rg.countdown", cd, cd.reference["answer"]).passed
    nums = cd.reference["entry"]["metadata"]["numbers"]
    trick = "*".join(["len('')", *map(str, nums)]) + f" + len('{'x' * cd.reference['entry']['metadata']['target']}')"
    assert not _grade("rg.countdown", cd, trick).passed


def test_partial_credit_never_reaches_full_credit():
    coin = DOMAINS["rg.coin_flip"]
    constant_zero = sum(_grade("rg.coin_flip", coin.task(s), "0").passed for s in range(20))
    assert constant_zero <= sum(float(coin.task(s).reference["answer"]) <= 1e-4 for s in range(20))
    ns = DOMAINS["rg.number_sorting"].task(0)
    import json

    right = json.loads(ns.reference["answer"].replace("'", '"'))
    shifted = json.dumps([f"{float(x) + 0.9:.2f}" for x in right])
    result = _grade("rg.number_sorting", ns, shifted)
    assert not result.passed and result.details.get("rg_score") == 1.0
    assert _grade("rg.number_sorting", ns, ns.reference["answer"]).passed
    pm = DOMAINS["rg.pool_matrix"].task(0)
    rows = [[float(x) for x in r.split()] for r in pm.reference["answer"].splitlines()]
    off = "\n".join(" ".join(f"{x * 1.008 + 0.01:.2f}" for x in r) for r in rows)
    assert not _grade("rg.pool_matrix", pm, off).passed
    assert _grade("rg.pool_matrix", pm, pm.reference["answer"]).passed


def test_non_finite_numbers_in_any_spelling_fail_before_scoring():
    assert all(non_finite(t) for t in ("nan", "nani", "1+nanj", "-inf", "infj", "1e999", "2E+400"))
    assert not any(non_finite(t) for t in ("1e10", "infinite loop", "banana", "0.5"))
    task = DOMAINS["rg.complex_arithmetic"].task(0)
    for answer in ("nani", "nanj", "1+nani", "1e999"):
        result = _grade("rg.complex_arithmetic", task, answer)
        assert not result.passed and "non-finite" in result.details["reason"]
    assert _grade("rg.complex_arithmetic", task, task.reference["answer"]).passed
