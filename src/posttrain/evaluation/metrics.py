"""Estimators: unbiased pass@k, confidence intervals, the exact McNemar test, Holm's correction.

Everything here is a pure function of numbers, so it is tested against brute force and known
values (`tests/test_eval_metrics.py`), without episodes.

Confidence intervals are over *tasks*: a domain's pass@k is the mean over its tasks of each
task's unbiased pass@k, and the uncertainty that matters is which tasks were drawn from the
domain, not only which samples. Two methods:

* `wilson` (default): the Wilson score interval for the mean, with an *effective* number of
  trials n_eff = p(1-p) / var(mean) (the design-effect correction for clustered proportions):
  with one sample per task n_eff is about the number of tasks; with several samples per task the
  spread between tasks decides, capped at the number of samples (`max_n`). Never degenerate at 0
  or 1 (where n_eff is the cap), and cheap.
* `bootstrap`: percentile bootstrap over tasks (fixed seed). Tighter when per-task values are
  spread, but it collapses to a zero-width interval when every task has the same value (e.g. all
  pass), which is why it is not the default.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import comb, sqrt
from statistics import NormalDist
from typing import Literal

import numpy as np

CIMethod = Literal["wilson", "bootstrap"]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased estimate of pass@k from n samples with c passing (Chen et al., 2021):
    1 - C(n-c, k) / C(n, k), computed as a product so that large n does not overflow."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def z_value(confidence: float) -> float:
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    return NormalDist().inv_cdf(0.5 + confidence / 2)


def wilson_interval(p: float, n: float, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a proportion p observed over n trials (n = 0 gives (0, 1));
    n may be an effective (non-integer) count."""
    if n <= 0:
        return (0.0, 1.0)
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"wilson_interval needs p in [0, 1], got {p}")
    z = z_value(confidence)
    z2n = z * z / n
    center = (p + z2n / 2) / (1 + z2n)
    half = z / (1 + z2n) * sqrt(p * (1 - p) / n + z2n / (4 * n))
    return (max(0.0, center - half), min(1.0, center + half))


def bootstrap_mean_interval(values: Sequence[float], confidence: float = 0.95,
                            samples: int = 2000, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of `values` (resampled with replacement)."""
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        return (0.0, 1.0)
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, size=(samples, x.size))].mean(axis=1)
    lo, hi = np.quantile(means, [(1 - confidence) / 2, (1 + confidence) / 2])
    return (float(lo), float(hi))


def effective_n(values: Sequence[float], max_n: int | None = None) -> float:
    """p(1-p) / var(mean) of per-task values in [0, 1]; `max_n` (default: len) when they do not vary."""
    x = np.asarray(values, dtype=float)
    cap = float(max_n if max_n is not None else x.size)
    if x.size < 2:
        return max(1.0, min(cap, float(x.size)))
    p = float(x.mean())
    var_mean = float(x.var(ddof=1)) / x.size
    if var_mean <= 0 or p * (1 - p) <= 0:
        return cap
    return max(1.0, min(cap, p * (1 - p) / var_mean))


def mean_interval(values: Sequence[float], method: CIMethod = "wilson", confidence: float = 0.95,
                  samples: int = 2000, seed: int = 0, max_n: int | None = None) -> tuple[float, float]:
    """Interval of the mean of per-task values in [0, 1] (see the module docstring); `max_n` caps
    Wilson's effective n (the number of samples behind the values)."""
    if method == "wilson":
        if not len(values):
            return (0.0, 1.0)
        return wilson_interval(float(np.mean(values)), effective_n(values, max_n), confidence)
    if method == "bootstrap":
        return bootstrap_mean_interval(values, confidence, samples, seed)
    raise ValueError(f"CI method must be 'wilson' or 'bootstrap', got {method!r}")


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value for b and c discordant pairs (binomial, p = 1/2)."""
    if b < 0 or c < 0:
        raise ValueError(f"discordant counts must be >= 0, got b={b} c={c}")
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(comb(n, i) for i in range(min(b, c) + 1))
    return min(1.0, 2 * tail / 2 ** n)


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values (same order as given)."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    adjusted = [1.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        adjusted[i] = running
    return adjusted


def percentiles(values: Sequence[float], qs: Sequence[float] = (50, 90, 99)) -> dict[str, float | None]:
    """{'p50': ..., 'p90': ..., 'p99': ...}; None when there are no values."""
    if not len(values):
        return {f"p{q:g}": None for q in qs}
    out = np.percentile(np.asarray(values, dtype=float), list(qs))
    return {f"p{q:g}": round(float(v), 6) for q, v in zip(qs, out)}
