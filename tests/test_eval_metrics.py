"""Estimators against brute force and known values; CI coverage on simulated data."""

from itertools import combinations
from math import comb

import numpy as np
import pytest

from posttrain.evaluation.metrics import (
    bootstrap_mean_interval,
    holm,
    mcnemar_exact,
    mean_interval,
    pass_at_k,
    percentiles,
    wilson_interval,
)


def brute_pass_at_k(n: int, c: int, k: int) -> float:
    outcomes = [True] * c + [False] * (n - c)
    subsets = list(combinations(range(n), k))
    return sum(any(outcomes[i] for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", [1, 2, 5, 8])
def test_pass_at_k_matches_brute_force(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(brute_pass_at_k(n, c, k), abs=1e-12)


def test_pass_at_k_large_n_matches_closed_form_and_rejects_bad_input():
    assert pass_at_k(200, 37, 10) == pytest.approx(1 - comb(163, 10) / comb(200, 10), rel=1e-12)
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    for bad in [(4, 5, 1), (4, 1, 0), (4, 1, 5), (4, -1, 1)]:
        with pytest.raises(ValueError, match="pass_at_k"):
            pass_at_k(*bad)


def test_wilson_known_values_and_edges():
    lo, hi = wilson_interval(0.5, 10)
    assert (lo, hi) == (pytest.approx(0.2366, abs=1e-4), pytest.approx(0.7634, abs=1e-4))
    lo, hi = wilson_interval(1.0, 20)
    assert hi == 1.0 and lo == pytest.approx(0.8389, abs=1e-4)   # never a zero-width interval
    lo, hi = wilson_interval(0.0, 20)
    assert lo == 0.0 and 0.15 < hi < 0.17
    assert wilson_interval(0.3, 0) == (0.0, 1.0)
    with pytest.raises(ValueError):
        wilson_interval(1.5, 3)


def _coverage(method: str, alpha: float, beta: float, tasks: int, samples: int, reps: int = 300) -> float:
    rng = np.random.default_rng(1)
    truth = alpha / (alpha + beta)
    hit = 0
    for r in range(reps):
        p = rng.beta(alpha, beta, size=tasks)          # a fresh draw of tasks from the distribution
        per_task = rng.binomial(samples, p) / samples  # pass@1 estimate of each task
        lo, hi = mean_interval(per_task, method, 0.95, samples=1000, seed=r, max_n=tasks * samples)
        hit += lo <= truth <= hi
    return hit / reps


@pytest.mark.parametrize("method", ["wilson", "bootstrap"])
def test_interval_coverage_on_simulated_task_distributions(method):
    # nominal 95% over a fresh draw of 40 tasks (4 samples each) per replicate; 300 replicates
    # give a standard error of ~1.3 points, so this band fails a wrong or vacuous interval
    for a, b in [(2.0, 3.0), (6.0, 1.0), (0.5, 0.5)]:
        cov = _coverage(method, a, b, tasks=40, samples=4)
        assert 0.92 <= cov <= 0.985, (method, a, b, cov)


def test_effective_n():
    from posttrain.evaluation.metrics import effective_n

    one_sample = [1.0] * 30 + [0.0] * 70          # one Bernoulli sample per task
    assert effective_n(one_sample) == pytest.approx(99, abs=0.5)
    assert effective_n([1.0] * 10, max_n=80) == 80   # no spread: every sample counts
    assert effective_n([0.25, 0.5, 0.75, 0.5], max_n=16) <= 16


def test_bootstrap_interval_is_seeded_and_brackets_the_mean():
    x = np.random.default_rng(0).random(50)
    a = bootstrap_mean_interval(x, seed=3)
    assert a == bootstrap_mean_interval(x, seed=3)
    assert a[0] < x.mean() < a[1]
    with pytest.raises(ValueError, match="wilson"):
        mean_interval([0.5], "normal")  # type: ignore[arg-type]


def test_mcnemar_exact_values():
    from scipy import stats  # imported here: scipy is slow to import at collection

    assert mcnemar_exact(1, 9) == pytest.approx(22 / 1024)
    assert mcnemar_exact(0, 5) == pytest.approx(2 / 32)
    assert mcnemar_exact(4, 4) == 1.0 and mcnemar_exact(0, 0) == 1.0
    for b, c in [(3, 12), (20, 7), (0, 1), (50, 71)]:
        assert mcnemar_exact(b, c) == pytest.approx(stats.binomtest(b, b + c, 0.5).pvalue, rel=1e-9)


def test_holm_adjustment():
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([]) == [] and holm([0.7]) == [0.7]


def test_percentiles():
    assert percentiles([]) == {"p50": None, "p90": None, "p99": None}
    out = percentiles(list(range(101)))
    assert out == {"p50": 50.0, "p90": 90.0, "p99": 99.0}
