"""The project's own train and eval splits pass its own contamination guard, as `posttrain run`
applies it to `train = ["*"]` (`pipeline.checks.check_contamination`, never overridden here)."""

from __future__ import annotations

import json

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


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason=(
    "known leaks, to fix in the generators (not the guard): 37 eval tasks of code.list.rotate, "
    "code.str.mask, code.str.rle, docs.chart.trough.line, docs.page.revenue-total and five "
    "geometry.drawing.* domains overlap their train splits at the run's sample sizes; strict, so "
    "the test fails once they are fixed and this marker must go"))
def test_every_registered_domain_passes_the_guard(tmp_path):
    # every family, sandboxed ones included, all at once (a leak across domains counts too); a
    # sample of each domain's tasks: the run's 200 per domain take ~20 min on a loaded 2-core machine
    registry = all_domains()
    domains = [d for d in registry.values() if checks.has_split(d, "train")]
    assert {d.family for d in domains} >= {"math", "text", "code", "terminal", "geometry", "docs"}
    evals = checks.eval_tasks(list(registry.values()), 3)
    checks.check_contamination(domains, evals, per_domain=12, run_dir=tmp_path, allow=False,
                               console=Console(quiet=True))
    saved = json.loads((tmp_path / "contamination.json").read_text())
    assert saved["ok"] and saved["n_train"] == 12 * len(domains) and saved["n_eval"] == len(evals)
