"""The reasoning-gym adapter: generators as `rg.*` domains, thresholded scores, fixes that hold."""

from __future__ import annotations

import random

import pytest

from posttrain.scheduling.domain_check import check_domains
from posttrain.tasks.families import reasoning_gym as rg
from posttrain.tasks.families.common import content_split
from posttrain.verifiers.base import Outcome, VerifierError

DOMAINS = {d.name: d for d in rg.domains()}

# A sample that covers every special case of the adapter plus some plain generators; the full
# set is covered by `posttrain tasks check --family rg`.
SAMPLE = ["rg.arc_agi", "rg.rearc", "rg.graph_color", "rg.rubiks_cube",
          "rg.puzzle24", "rg.futoshiki", "rg.list_functions", "rg.gsm_symbolic", "rg.coin_flip",
          "rg.basic_arithmetic", "rg.spell_backward", "rg.sudoku", "rg.number_sorting",
          "rg.time_intervals", "rg.simple_integration"]


def _grade(name: str, task, answer: str):
    return DOMAINS[name].verifier.verify(task, Outcome(answer=answer))


@pytest.mark.slow
def test_domains_are_the_generators_minus_the_skipped_ones():
    from reasoning_gym.factory import DATASETS

    assert tuple(sorted(DATASETS)) == rg.NAMES  # the static list matches the installed version
    assert set(DOMAINS) == {f"rg.{n}" for n in rg.NAMES if n not in rg.SKIPPED}
    assert len(DOMAINS) >= 90 and "rg.codeio" not in DOMAINS and "rg.propositional_logic" not in DOMAINS
    assert all(d.family == "rg" and d.env == "single" and d.stop == () for d in DOMAINS.values())


@pytest.mark.slow
def test_sample_passes_the_self_check():
    report = check_domains([DOMAINS[n] for n in SAMPLE], per_domain=2)
    assert report.ok, [(f.domain, f.kind, f.detail) for f in report.failures]
    assert report.tasks == 2 * len(SAMPLE) and report.negative_fail_rate == 1.0


@pytest.mark.slow
def test_partial_credit_is_thresholded_to_a_fail():
    task = DOMAINS["rg.spell_backward"].task(0)
    answer = task.reference["answer"]
    # reasoning-gym's default scorer gives len(answer)/len(text) to a text containing the answer
    result = _grade("rg.spell_backward", task, f"{answer} {answer}")
    assert not result.passed and result.score == 0.0 and 0 < result.details["rg_score"] < 1
    ok = _grade("rg.spell_backward", task, f"thinking...\n<answer> {answer} </answer>")
    assert ok.passed and ok.score == 1.0 and ok.verifier_version == rg.RG_SCORE.name + "@" + rg.RG_SCORE.version


def test_puzzle24_must_use_the_given_numbers():
    a, b = DOMAINS["rg.puzzle24"].task(0), DOMAINS["rg.puzzle24"].task(1)
    assert sorted(a.reference["entry"]["metadata"]["numbers"]) != sorted(b.reference["entry"]["metadata"]["numbers"])
    assert _grade("rg.puzzle24", a, a.reference["answer"]).passed
    wrong = _grade("rg.puzzle24", a, b.reference["answer"])  # makes 24, with other numbers
    assert not wrong.passed and wrong.details["rg_score"] == 1.0 and "extra check" in wrong.details["reason"]


def test_generation_is_deterministic_and_leaves_global_random_alone():
    random.seed(123)
    before = random.getstate()
    d = DOMAINS["rg.list_functions"]  # draws from the global random state internally
    first = d.task(3, "eval").model_dump_json()
    assert random.getstate() == before
    assert d.task(3, "eval").model_dump_json() == first


def test_splits_are_content_disjoint():
    d = DOMAINS["rg.basic_arithmetic"]
    train = {d.task(s, "train").prompt for s in range(15)}
    evals = {d.task(s, "eval").prompt for s in range(15)}
    assert not train & evals
    assert all(content_split(p) == "eval" for p in evals) and all(content_split(p) == "train" for p in train)


@pytest.mark.slow
def test_reference_is_json_and_broken_references_are_infra_errors():
    task = DOMAINS["rg.arc_agi"].task(0)
    assert isinstance(task.reference["entry"]["metadata"]["output"], list)  # stored as JSON
    assert _grade("rg.arc_agi", task, task.reference["answer"]).passed  # restored as tuples
    broken = task.model_copy(update={"reference": {"answer": "1"}})
    with pytest.raises(VerifierError, match="reasoning-gym data"):
        _grade("rg.arc_agi", broken, "1")
    assert not _grade("rg.arc_agi", task, "").passed and not _grade("rg.arc_agi", task, "nan").passed


def test_skewed_generators_are_thinned_to_their_answer_caps():
    """syllogism answers "Yes" 70% of the time and circuit_logic "0" 60%: a policy learns the
    constant answer. The shipped caps (measured by `answer_caps`) thin them to ~uniform."""
    from collections import Counter

    from posttrain.tasks.families.rg_caps import answer_caps

    caps = rg._shipped_caps()
    assert {"syllogism", "circuit_logic", "shortest_path", "maze"} <= set(caps)
    assert caps["circuit_logic"] == answer_caps("circuit_logic")  # the table is what the generator gives
    assert answer_caps("chain_sum") is None  # an unskewed generator needs no cap
    domain = rg._make("syllogism")
    answers = Counter(domain.task(s, "train").reference["answer"] for s in range(300))
    assert 0.4 < answers["Yes"] / 300 < 0.6  # 0.70 unthinned


@pytest.mark.slow  # ~25 s: 800 tasks generated and graded
def test_thinned_generators_leave_no_guessable_constant_answer():
    """`tasks check`'s guess probe on the capped generators: no one answer passes enough tasks."""
    from posttrain.tasks.guess import guess_probe

    for name in ("syllogism", "circuit_logic", "maze", "self_reference"):
        guess = guess_probe(rg._make(name), 200)
        assert guess is not None and not guess.guessable, (name, guess)


def test_a_caps_table_of_another_reasoning_gym_version_is_refused(tmp_path, monkeypatch):
    stale = tmp_path / "caps.json"
    stale.write_text('{"reasoning_gym": "0.0.1", "caps": {}}')
    monkeypatch.setattr(rg, "ANSWER_CAPS_FILE", stale)
    rg._shipped_table.cache_clear()
    try:
        with pytest.raises(RuntimeError, match="measured on reasoning-gym 0.0.1"):
            rg._make("syllogism").task(0, "train")
    finally:
        rg._shipped_table.cache_clear()
