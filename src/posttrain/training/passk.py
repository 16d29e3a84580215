"""Sampled pass@1, pass@k and greedy accuracy per domain, through the real episode runner.

This is the quick measurement the RL recipe and `models/pretrain.py` use to see whether
training moved anything. It is *not* the project's evaluator (`posttrain.evaluation`, with
confidence intervals, contamination and A/B checks): no intervals, no storage, one process.

Sampling is seeded (`seed`) inside `torch.random.fork_rng`, so two evaluations of the same
weights (a local policy) agree exactly and the caller's RNG stream (a training run's) is left untouched.

pass@k uses the unbiased estimator of Chen et al. (2021): with n samples of which c pass,
pass@k = 1 - C(n - c, k) / C(n, k), averaged over tasks. `infra_error` episodes are excluded
(and counted), never scored as failures.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import comb

import torch

from posttrain.policies.base import Policy
from posttrain.rollout.runner import EpisodeSpec, run_episodes
from posttrain.tasks.domain import Domain
from posttrain.values.generation import SamplingParams


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of k samples (drawn from n, c correct) passes."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    return 1.0 - comb(n - c, k) / comb(n, k)


def evaluate(policy: Policy, domains: Sequence[Domain], *, n_tasks: int = 50, n_samples: int = 8,
             temperature: float = 1.0, max_tokens: int = 16, split: str = "eval",
             greedy: bool = True, seed: int | None = 0) -> dict[str, dict[str, float]]:
    """Per domain: pass1 (sampled), passk (k = n_samples), greedy, n_tasks, infra_errors.

    Tasks are `domain.task(seed, split)` for seeds 0..n_tasks-1: the same tasks every call."""
    if n_tasks < 1 or n_samples < 1:
        raise ValueError(f"evaluate needs n_tasks >= 1 and n_samples >= 1, got {n_tasks}, {n_samples}")
    tasks = [(d, d.task(i, split)) for d in domains for i in range(n_tasks)]  # type: ignore[arg-type]
    specs = [EpisodeSpec(d, t) for d, t in tasks for _ in range(n_samples)]
    with torch.random.fork_rng():
        if seed is not None:
            torch.manual_seed(seed)
        sampled = run_episodes(specs, policy, SamplingParams(temperature=temperature, max_tokens=max_tokens))
    greedy_runs = (run_episodes([EpisodeSpec(d, t) for d, t in tasks], policy,
                                SamplingParams(temperature=0.0, max_tokens=max_tokens))
                   if greedy else [])
    out: dict[str, dict[str, float]] = {}
    for di, domain in enumerate(domains):
        p1, pk, g, infra, counted = 0.0, 0.0, 0.0, 0, 0
        for ti in range(n_tasks):
            at = (di * n_tasks + ti)
            group = sampled[at * n_samples:(at + 1) * n_samples]
            ok = [t for t in group if t.trainable]
            infra += len(group) - len(ok)
            if ok:
                c = sum(bool(t.passed) for t in ok)
                p1 += c / len(ok)
                pk += pass_at_k(len(ok), c, len(ok))
                counted += 1
            if greedy_runs and greedy_runs[at].trainable:
                g += float(bool(greedy_runs[at].passed))
        out[domain.name] = {"pass1": p1 / max(counted, 1), "passk": pk / max(counted, 1),
                            "greedy": g / n_tasks if greedy_runs else float("nan"),
                            "n_tasks": n_tasks, "infra_errors": infra}
    return out
