"""Per-domain, per-family and overall numbers from task records.

Scores (pass@k) count only scored samples: `infra_error` episodes are excluded and reported as
their own rate. A task enters pass@k only when it has at least k scored samples (`tasks` in each
pass@k entry says how many did). Averages:

* `micro_pass1` -- mean of per-task pass@1 over every scored task (large domains weigh more);
* `macro_pass1` -- mean of per-domain pass@1 over domains (each domain weighs the same); families
  get both too. Macro is the headline: a task distribution of many domains should not be
  dominated by whichever domain happened to contribute the most tasks.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from statistics import fmean
from typing import Any

from posttrain.evaluation.metrics import CIMethod, mean_interval, pass_at_k, percentiles
from posttrain.evaluation.records import TaskRecord


def _r(x: float | None, nd: int = 6) -> float | None:
    return None if x is None else round(float(x), nd)


def task_pass_at_k(record: TaskRecord, k: int) -> float | None:
    scored = record.scored
    if len(scored) < k:
        return None
    return pass_at_k(len(scored), sum(bool(s.passed) for s in scored), k)


def _passk_entry(records: Sequence[TaskRecord], k: int, ci: CIMethod, confidence: float,
                 bootstrap_samples: int, seed: int) -> dict[str, Any]:
    counted = [(r, v) for r, v in ((r, task_pass_at_k(r, k)) for r in records) if v is not None]
    values = [v for _, v in counted]
    if not values:
        return {"value": None, "ci": None, "tasks": 0}
    # independent draws behind the values: n // k disjoint k-subsets per task
    max_n = sum(max(1, len(r.scored) // k) for r, _ in counted)
    lo, hi = mean_interval(values, ci, confidence, bootstrap_samples, seed, max_n=max_n)
    return {"value": _r(fmean(values)), "ci": [_r(lo), _r(hi)], "tasks": len(values)}


def _rework(records: Sequence[TaskRecord]) -> dict[str, Any]:
    wins = [s for r in records for s in r.samples if s.passed]
    if not wins:
        return {"successes": 0, "rework_rate": None, "turns_to_success": None, "runs_to_success": None}
    return {"successes": len(wins), "rework_rate": _r(sum(s.reworked for s in wins) / len(wins)),
            "turns_to_success": _r(fmean(s.turns for s in wins), 3),
            "runs_to_success": _r(fmean(s.runs for s in wins), 3)}


def _cost(samples: Sequence[Any]) -> dict[str, Any]:
    n = max(len(samples), 1)
    totals = {key: sum(getattr(s, key) for s in samples)
              for key in ("prompt_tokens", "output_tokens", "gen_s", "sandbox_s")}
    return {"prompt_tokens": int(totals["prompt_tokens"]), "output_tokens": int(totals["output_tokens"]),
            "tokens_estimated": any(s.tokens_estimated for s in samples),
            "gen_s": _r(totals["gen_s"]), "sandbox_s": _r(totals["sandbox_s"]),
            "per_episode": {key: _r(value / n, 4) for key, value in totals.items()}}


def domain_summary(records: Sequence[TaskRecord], ks: Sequence[int], *, ci: CIMethod = "wilson",
                   confidence: float = 0.95, bootstrap_samples: int = 2000, seed: int = 0) -> dict[str, Any]:
    """Numbers of one domain's task records (see the module docstring)."""
    samples = [s for r in records for s in r.samples]
    scored = [s for s in samples if s.scored]
    infra = len(samples) - len(scored)
    out: dict[str, Any] = {
        "family": records[0].family if records else "", "env": records[0].env if records else "",
        "tasks": len(records), "episodes": len(samples), "scored": len(scored), "infra_errors": infra,
        "infra_error_rate": _r(infra / len(samples)) if samples else None,
        "tasks_unscored": sum(not r.scored for r in records),
    }
    for k in ks:
        out[f"pass@{k}"] = _passk_entry(records, k, ci, confidence, bootstrap_samples, seed)
    out["truncation_rate"] = _r(sum(s.status == "truncated" for s in scored) / len(scored)) if scored else None
    out["length_cut_rate"] = _r(sum(s.length_cut for s in scored) / len(scored)) if scored else None
    out["rework"] = _rework(records) if out["env"] == "tools" else None
    out["cost"] = _cost(samples)
    out["latency_s"] = percentiles([s.total_s for s in samples])
    return out


def summarize(records: Iterable[TaskRecord], ks: Sequence[int], *, ci: CIMethod = "wilson",
              confidence: float = 0.95, bootstrap_samples: int = 2000, seed: int = 0) -> dict[str, Any]:
    """{'domains', 'families', 'macro_pass1', 'micro_pass1', 'infra_error_rate', ...}."""
    by_domain: dict[str, list[TaskRecord]] = {}
    for r in records:
        by_domain.setdefault(r.domain, []).append(r)
    opts: dict[str, Any] = dict(ci=ci, confidence=confidence, bootstrap_samples=bootstrap_samples, seed=seed)
    ks = sorted(set(ks) | {1})
    domains = {d: domain_summary(rs, ks, **opts) for d, rs in sorted(by_domain.items())}

    def averages(names: Sequence[str]) -> dict[str, Any]:
        task_p1 = [v for n in names for v in (task_pass_at_k(r, 1) for r in by_domain[n]) if v is not None]
        dom_p1 = [domains[n]["pass@1"]["value"] for n in names if domains[n]["pass@1"]["value"] is not None]
        episodes = sum(domains[n]["episodes"] for n in names)
        n_scored = sum(domains[n]["scored"] for n in names)
        infra = sum(domains[n]["infra_errors"] for n in names)
        micro = fmean(task_p1) if task_p1 else None
        recs = [r for n in names for r in by_domain[n]]
        samples = [s for r in recs for s in r.samples]
        scored = [s for s in samples if s.scored]
        tools = [r for r in recs if r.env == "tools"]
        return {"domains": len(names), "tasks": sum(domains[n]["tasks"] for n in names),
                "truncation_rate": _r(sum(s.status == "truncated" for s in scored) / len(scored)) if scored else None,
                "rework": _rework(tools) if tools else None, "cost": _cost(samples),
                "latency_s": percentiles([s.total_s for s in samples]),
                "macro_pass1": _r(fmean(dom_p1)) if dom_p1 else None, "micro_pass1": _r(micro),
                "micro_pass1_ci": ([_r(x) for x in mean_interval(task_p1, "wilson", confidence, max_n=n_scored)]
                                   if micro is not None else None),
                "infra_error_rate": _r(infra / episodes) if episodes else None, "episodes": episodes}

    fams: dict[str, list[str]] = {}
    for name, d in domains.items():
        fams.setdefault(d["family"], []).append(name)
    overall = averages(list(domains))
    keep = ("macro_pass1", "micro_pass1", "micro_pass1_ci", "infra_error_rate", "episodes", "tasks",
            "truncation_rate", "rework", "cost", "latency_s")
    return {"domains": domains, "families": {f: averages(ns) for f, ns in sorted(fams.items())},
            **{key: overall[key] for key in keep}, "k": list(ks)}
