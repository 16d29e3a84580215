"""Per-domain pass@1, pass@k and greedy accuracy in one call: the quick look a training or
pretraining script takes at a model, through the project's evaluator (`run_eval`).

    pass_rates(policy, domains, n_tasks=50, n_samples=8)
    # {'text.upper.l3': {'pass1': 0.74, 'passk': 1.0, 'greedy': 0.9, 'n_tasks': 50, 'infra_errors': 0}}

Tasks are `domain.task(seed, split)` for seeds 0..n_tasks-1 (a domain that repeats a problem keeps
it once). Sampling is seeded (`seed`), so two looks at the same weights agree. pass@k is the
unbiased estimator over the samples (`posttrain.evaluation.metrics.pass_at_k`); `infra_error`
episodes are excluded and counted, never scored as failures.
"""

from __future__ import annotations

from collections.abc import Sequence

from posttrain.evaluation.config import EvalConfig
from posttrain.evaluation.runner import run_eval
from posttrain.policies.base import Policy
from posttrain.tasks.domain import Domain


def pass_rates(policy: Policy, domains: Sequence[Domain], *, n_tasks: int = 50, n_samples: int = 8,
               temperature: float = 1.0, max_tokens: int = 16, split: str = "eval",
               greedy: bool = True, seed: int = 0, workers: int = 1) -> dict[str, dict[str, float]]:
    """Per domain: pass1 (sampled), passk (k = n_samples), greedy (nan when `greedy` is off),
    n_tasks, infra_errors."""
    tasks = [(d, d.task(i, split)) for d in domains for i in range(n_tasks)]  # type: ignore[arg-type]
    sampled = run_eval(policy, tasks, EvalConfig(k=(1, n_samples), temperature=temperature,
                                                 max_tokens=max_tokens, seed=seed, workers=workers),
                       name="quick-sampled")
    greedy_result = (run_eval(policy, tasks, EvalConfig(k=(1,), temperature=0.0, max_tokens=max_tokens,
                                                        seed=seed, workers=workers), name="quick-greedy")
                     if greedy else None)
    out: dict[str, dict[str, float]] = {}
    for d in domains:
        s = sampled.summary["domains"].get(d.name, {})
        g = greedy_result.summary["domains"].get(d.name, {}) if greedy_result else {}
        out[d.name] = {"pass1": (s.get("pass@1") or {}).get("value") or 0.0,
                       "passk": (s.get(f"pass@{n_samples}") or {}).get("value") or 0.0,
                       "greedy": ((g.get("pass@1") or {}).get("value") or 0.0) if greedy_result else float("nan"),
                       "n_tasks": s.get("tasks", 0), "infra_errors": s.get("infra_errors", 0)}
    return out
