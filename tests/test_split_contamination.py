"""The project's own train and eval splits pass its own contamination guard, as `posttrain run`
applies it to `train = ["*"]` (`pipeline.checks.check_contamination`, never overridden here)."""

from __future__ import annotations

import json
import random

import pytest
from rich.console import Console

from posttrain.evaluation.contamination import check_contamination
from posttrain.pipeline import checks
from posttrain.tasks.registry import all_domains, get_domain
from posttrain.verifiers.base import Outcome


def test_count_primes_splits_are_disjoint_under_the_guard():
    # the run's own sample sizes on `train = ["*"]`: 200 train tasks per domain, 10 eval tasks.
    # Overlapping ranges used to share their stored prime lists (near-duplicate references).
    pytest.importorskip("reasoning_gym")
    domain = get_domain("rg.count_primes")
    train = [domain.task(seed, "train") for seed in range(200)]
    evals = [domain.task(seed, "eval") for seed in range(10)]
    report = check_contamination(train, evals)
    assert report.ok, report.matches[:3]
    task = evals[0]
    assert "primes" not in task.reference["entry"]["metadata"]
    assert {"start", "end"} <= set(task.reference["entry"]["metadata"])
    # what is left is still all the scorer needs: the oracle passes, a wrong count fails
    answer = task.reference["answer"]
    assert domain.verifier.verify(task, Outcome(answer=answer)).passed
    assert not domain.verifier.verify(task, Outcome(answer=str(int(answer) + 1))).passed


def _guard(names: list[str], n_train: int, n_eval: int):
    domains = [get_domain(n) for n in names]
    train = [d.task(seed, "train") for d in domains for seed in range(n_train)]
    evals = [d.task(seed, "eval") for d in domains for seed in range(n_eval)]
    return check_contamination(train, evals)


def test_drawing_prompts_name_their_drawing():
    # the picture is the problem, and the guard reads text: a constant prompt made every eval
    # drawing an exact duplicate of every training one
    from posttrain.tasks.families.geometry.drawings import drawing_number

    domain = get_domain("geometry.drawing.box.dims")
    a, b, e = domain.task(0, "train"), domain.task(1, "train"), domain.task(0, "eval")
    assert len({a.prompt, b.prompt, e.prompt}) == 3
    assert drawing_number(a.reference["statement"]) in a.prompt
    assert domain.task(0, "train").prompt == a.prompt  # same drawing, same number
    report = _guard(["geometry.drawing.box.dims", "geometry.drawing.sphere.radius"], 12, 3)
    assert report.ok, report.matches[:3]


def test_code_templates_split_near_duplicate_functions_together():
    # rotate left by k and right by k differ by a sign (each is the other's wrong version):
    # one split for both, in the plain and the repair domains
    from posttrain.tasks.families.code.lists import ROTATE
    from posttrain.tasks.families.code.template import problem_split

    for k in range(1, 13):
        assert problem_split(ROTATE, {"dir": "left", "k": k}) == problem_split(ROTATE, {"dir": "right", "k": k})
    assert {problem_split(ROTATE, {"dir": "left", "k": k}) for k in range(1, 13)} == {"train", "eval"}
    report = _guard(["code.list.rotate", "code.repair.list.rotate", "code.str.rle", "code.repair.str.rle",
                     "code.str.mask", "code.str.caesar"], 40, 5)
    assert report.ok, report.matches[:3]


def test_names_and_free_numbers_do_not_decide_the_split():
    # fizz with 'Buzz' or 'Zap' for multiples of 7 is one function; 300 or 1300 dollars at one
    # rate and term is one short prompt a few characters apart: each pair shares a split
    from posttrain.tasks.families.code.numbers import FIZZ
    from posttrain.tasks.families.code.template import problem_split

    assert problem_split(FIZZ, {"a": 7, "b": 9, "w1": "Buzz", "w2": "Fizz"}) == \
        problem_split(FIZZ, {"a": 7, "b": 9, "w1": "Zap", "w2": "Fizz"})
    interest = get_domain("math.word.interest")
    terms = {split: {(t.reference["r"], t.reference["n"]) for t in (interest.task(s, split) for s in range(30))}
             for split in ("train", "eval")}
    assert terms["train"].isdisjoint(terms["eval"])
    report = _guard(["code.num.fizz", "math.word.interest"], 200, 10)
    assert report.ok, report.matches[:3]


def test_timeout_statuses_are_partitioned_by_split():
    # seven possible answers: by content, an eval task's expected status.txt (and its script
    # and oracle) were a training task's; now the answer decides the split
    domain = get_domain("terminal.proc.timeout")
    status = {split: {domain.task(s, split).verifier["args"]["files"]["status.txt"].strip() for s in range(40)}
              for split in ("train", "eval")}
    assert status["eval"] == {"143", "2", "7", "9"} and status["train"] >= {"124", "137", "0"}
    assert status["train"].isdisjoint(status["eval"])
    report = _guard(["terminal.proc.timeout"], 200, 10)
    assert report.ok, report.matches[:3]


def test_docs_companies_and_keyed_years_are_partitioned_by_split():
    from posttrain.tasks.families.documents.statements import company_name, first_year

    rng = random.Random(0)
    eval_names = {company_name(rng, "eval") for _ in range(200)}
    train_names = {company_name(rng, "train") for _ in range(200)}
    assert eval_names and train_names and not eval_names & train_names
    assert {first_year(rng, "eval", keyed=True) for _ in range(100)} == {2014, 2019}
    assert {first_year(rng, "train", keyed=True) for _ in range(200)}.isdisjoint({2014, 2019})
    assert len({first_year(rng, "eval", keyed=False) for _ in range(200)}) == 11  # free when unkeyed
    # the two leaks this fixed: a revenue-by-year schema shared with a sibling format, and a
    # peak/trough chart of one company
    report = _guard(["docs.page.revenue-total", "docs.finance.revenue-total.csv", "docs.finance.revenue-total.html",
                     "docs.chart.trough.line", "docs.chart.peak.line"], 40, 5)
    assert report.ok, report.matches[:3]


def test_geometry_sizes_are_partitioned_by_split():
    # a stool 6.5 or 7 high (checks that do not read the height), a sphere one coordinate away:
    # near-duplicates in a small space; every drawn size is now a value of the problem's split
    from posttrain.tasks.families.geometry.common import half, value_split

    assert half(random.Random(0), 0.5, 8) in {x / 2 for x in range(1, 17)}  # unpartitioned outside a draw
    assert {value_split(x / 2) for x in range(-12, 13)} == {"train", "eval"}
    domain = get_domain("geometry.place.sphere-center")
    for split in ("train", "eval"):
        for seed in range(10):
            sizes = domain.task(seed, split).reference["oracle"].split("(")[2].split(")")[0]
            assert value_split(float(sizes)) == split  # the radius
    report = _guard(["geometry.furniture.stool", "geometry.stack.stairs", "geometry.place.sphere-center",
                     "geometry.box.dims", "geometry.script.box.dims"], 60, 10)
    assert report.ok, report.matches[:3]


def test_rg_problems_written_two_ways_are_in_one_split():
    # one problem under other names, emoji, verbs or irrelevant numbers (with the same answer)
    # went to both splits: the guard rightly found the eval copies
    pytest.importorskip("reasoning_gym")
    import re

    def keys(name: str, key) -> dict[str, set[str]]:
        domain = get_domain(name)
        return {split: {key(domain.task(seed, split)) for seed in range(40)} for split in ("train", "eval")}

    masked = keys("rg.aiw", lambda t: re.sub(r"[A-Z][a-z]+", "_", t.prompt))
    templates = keys("rg.gsm_symbolic", lambda t: " ".join(sorted(t.reference["entry"]["metadata"]["variables"])))
    sentences = keys("rg.emoji_mystery", lambda t: t.reference["answer"])
    integrals = keys("rg.intermediate_integration", lambda t: t.reference["answer"])
    for found in (masked, templates, sentences, integrals):
        assert found["train"] and found["eval"] and found["train"].isdisjoint(found["eval"])
    report = _guard(["rg.aiw", "rg.gsm_symbolic", "rg.emoji_mystery", "rg.intermediate_integration"], 200, 10)
    assert report.ok, report.matches[:3]


@pytest.mark.slow
def test_every_registered_domain_passes_the_guard(tmp_path):
    # every family, sandboxed ones included, all at once (a leak across domains counts too); a
    # sample of each domain's tasks: the run's 200 per domain take ~20 min on a loaded 2-core
    # machine. 24 per domain, as the guard needs 5 tasks sharing a text to call it a template:
    # with 12, rg.aiw's three templates are 4-5 tasks each and two of its problems look alike
    registry = all_domains()
    domains = [d for d in registry.values() if checks.has_split(d, "train")]
    assert {d.family for d in domains} >= {"math", "text", "code", "terminal", "geometry", "docs"}
    evals = checks.eval_tasks(list(registry.values()), 3)
    checks.check_contamination(domains, evals, per_domain=24, run_dir=tmp_path, allow=True,
                               console=Console(quiet=True))
    saved = json.loads((tmp_path / "contamination.json").read_text())
    assert saved["n_train"] == 24 * len(domains) and saved["n_eval"] == len(evals)
    assert saved["ok"], saved["by_domain"]


def test_a_resumed_run_does_not_check_the_same_tasks_again(tmp_path, monkeypatch):
    """The check is recorded with a key of what it compared; run again on the same tasks (a
    resume) it is not repeated, on other tasks or after a refusal it is."""
    calls = []
    monkeypatch.setattr(checks, "_contamination",
                        lambda train, evals: calls.append(len(train)) or check_contamination(train, evals))
    domains = [get_domain("math.add.d1"), get_domain("text.upper.l3")]
    evals = checks.eval_tasks(domains, 3)
    quiet = Console(quiet=True)

    def check(per_domain=8, ev=evals, allow=False):
        checks.check_contamination(domains, ev, per_domain=per_domain, run_dir=tmp_path, allow=allow, console=quiet)

    check()
    first = json.loads((tmp_path / "contamination.json").read_text())
    check()
    assert calls == [16] and json.loads((tmp_path / "contamination.json").read_text()) == first
    check(per_domain=9)                        # another training sample
    check(per_domain=9, ev=evals[:-1])         # other eval tasks
    assert calls == [16, 18, 18]
    (tmp_path / "contamination.json").write_text(json.dumps({**first, "refused": True}))
    check()                                    # a refused check is never taken as done
    assert len(calls) == 4
    (tmp_path / "contamination.json").write_text("{torn")
    check()
    assert len(calls) == 5 and json.loads((tmp_path / "contamination.json").read_text())["key"] == first["key"]
