"""Paired A/B comparison of two evaluations on identical tasks and seeds.

Pairs are (task, sample index): the eval runner gives sample j of a task the same seed under any
policy, so the two sides differ only by the model. Per domain and overall:

* `diff` -- pass@1 of B minus pass@1 of A, over the paired samples (per task: the mean of its
  paired samples; per domain: the mean over tasks; overall: the mean over domains, i.e. macro);
* `ci` -- paired bootstrap over tasks (tasks are resampled with both sides' outcomes together;
  overall, resampling is stratified by domain);
* `mcnemar_p` -- the exact McNemar test on the discordant paired samples (b: A passed and B failed,
  c: A failed and B passed). Per-domain p-values are also Holm-corrected across domains
  (`p_holm`), since with many domains some would otherwise look significant by chance.

A difference is *significant* when the bootstrap interval excludes 0 and the (Holm-corrected, for
domains) McNemar p is below alpha: both tests must agree. McNemar treats the samples of one task
as independent pairs, which they are given the task but not across the draw of tasks; the
task-level bootstrap covers that, which is why both are required. A significant negative
difference is a *regression*.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from statistics import fmean
from typing import Any

import numpy as np

from posttrain.errors import write_text_atomic
from posttrain.evaluation.metrics import holm, mcnemar_exact
from posttrain.evaluation.result import EvalResult, safe_name

AB_DIR = "ab"
AB_FORMAT = "posttrain.ab/1"


def _pairs(a: EvalResult, b: EvalResult) -> tuple[dict[str, list[tuple[str, list[tuple[bool, bool]]]]], int]:
    """domain -> [(task hash, [(a passed, b passed) per paired sample])], and unpaired task count."""
    b_by_hash = {r.hash: r for r in b.records}
    out: dict[str, list[tuple[str, list[tuple[bool, bool]]]]] = {}
    unpaired = len({r.hash for r in b.records} - {r.hash for r in a.records})
    for ra in a.records:
        rb = b_by_hash.get(ra.hash)
        if rb is None:
            unpaired += 1
            continue
        sa, sb = ra.by_index(), rb.by_index()
        pairs = [(bool(sa[j].passed), bool(sb[j].passed)) for j in sorted(set(sa) & set(sb))
                 if sa[j].scored and sb[j].scored]
        if pairs:
            out.setdefault(ra.domain, []).append((ra.hash, pairs))
    return out, unpaired


def _config_warnings(a: EvalResult, b: EvalResult) -> list[str]:
    warnings = []
    for fld in ("seed", "temperature", "top_p", "max_tokens"):
        va, vb = getattr(a.config, fld), getattr(b.config, fld)
        if va != vb:
            warnings.append(f"{fld} differs ({va} vs {vb}): the pairs are not on identical sampling")
    return warnings


@dataclass
class ABReport:
    a: str
    b: str
    alpha: float
    confidence: float
    domains: dict[str, dict[str, Any]]
    overall: dict[str, Any]
    unpaired_tasks: int = 0
    warnings: list[str] = field(default_factory=list)

    @property
    def regressions(self) -> list[str]:
        """Domains (and 'overall') with a significant regression of B against A."""
        out = [d for d, v in self.domains.items() if v["regression"]]
        return out + (["overall"] if self.overall.get("regression") else [])

    def to_dict(self) -> dict[str, Any]:
        return {"format": AB_FORMAT, "a": self.a, "b": self.b, "alpha": self.alpha,
                "confidence": self.confidence, "domains": self.domains, "overall": self.overall,
                "unpaired_tasks": self.unpaired_tasks, "warnings": self.warnings,
                "regressions": self.regressions}

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "A/B file") -> ABReport:
        if d.get("format") != AB_FORMAT:
            raise ValueError(f"{where}: field 'format' is {d.get('format')!r}, expected {AB_FORMAT!r}")
        return cls(a=d["a"], b=d["b"], alpha=d["alpha"], confidence=d["confidence"], domains=d["domains"],
                   overall=d["overall"], unpaired_tasks=d.get("unpaired_tasks", 0),
                   warnings=list(d.get("warnings", [])))

    def save_to_run(self, run_dir: str | Path, name: str = "") -> Path:
        path = Path(run_dir) / AB_DIR / f"{safe_name(name or f'{self.a}-vs-{self.b}')}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, json.dumps(self.to_dict(), indent=1), "the A/B comparison")
        return path


def _bootstrap_means(x: np.ndarray, samples: int, rng: np.random.Generator) -> np.ndarray:
    return x[rng.integers(0, x.size, size=(samples, x.size))].mean(axis=1)


def compare(a: EvalResult, b: EvalResult, *, alpha: float = 0.05, confidence: float = 0.95,
            bootstrap_samples: int = 2000, seed: int = 0) -> ABReport:
    """Paired comparison of B against A (positive diff = B better); see the module docstring."""
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    pairs, unpaired = _pairs(a, b)
    warnings = _config_warnings(a, b)
    if unpaired:
        warnings.append(f"{unpaired} task(s) are in only one of the two evaluations and were left out")
    if not pairs:
        raise ValueError(f"A/B {a.name} vs {b.name}: no task has a scored sample on both sides "
                         "(were they run on the same task set?)")
    rng = np.random.default_rng(seed)
    q = [(1 - confidence) / 2, (1 + confidence) / 2]
    domains: dict[str, dict[str, Any]] = {}
    boot = []
    for dom, tasks in sorted(pairs.items()):
        pa = np.array([fmean(x for x, _ in ps) for _, ps in tasks])
        pb = np.array([fmean(y for _, y in ps) for _, ps in tasks])
        diffs = pb - pa
        means = _bootstrap_means(diffs, bootstrap_samples, rng)
        boot.append(means)
        flat = [p for _, ps in tasks for p in ps]
        nb = sum(x and not y for x, y in flat)
        nc = sum(y and not x for x, y in flat)
        lo, hi = np.quantile(means, q)
        domains[dom] = {"tasks": len(tasks), "pairs": len(flat), "pass1_a": round(float(pa.mean()), 6),
                        "pass1_b": round(float(pb.mean()), 6), "diff": round(float(diffs.mean()), 6),
                        "ci": [round(float(lo), 6), round(float(hi), 6)], "a_only": nb, "b_only": nc,
                        "mcnemar_p": mcnemar_exact(nb, nc)}
    for dom, p in zip(domains, holm([v["mcnemar_p"] for v in domains.values()])):
        v = domains[dom]
        v["p_holm"] = p
        v["significant"] = bool(p < alpha and (v["ci"][0] > 0 or v["ci"][1] < 0))
        v["regression"] = v["significant"] and v["diff"] < 0
        v["improvement"] = v["significant"] and v["diff"] > 0
    overall_boot = np.mean(boot, axis=0)
    lo, hi = np.quantile(overall_boot, q)
    nb = sum(v["a_only"] for v in domains.values())
    nc = sum(v["b_only"] for v in domains.values())
    diff = fmean(v["diff"] for v in domains.values())
    p = mcnemar_exact(nb, nc)
    significant = bool(p < alpha and (lo > 0 or hi < 0))
    overall = {"tasks": sum(v["tasks"] for v in domains.values()),
               "pairs": sum(v["pairs"] for v in domains.values()),
               "pass1_a": round(fmean(v["pass1_a"] for v in domains.values()), 6),
               "pass1_b": round(fmean(v["pass1_b"] for v in domains.values()), 6),
               "diff": round(diff, 6), "ci": [round(float(lo), 6), round(float(hi), 6)],
               "a_only": nb, "b_only": nc, "mcnemar_p": p, "significant": significant,
               "regression": significant and diff < 0, "improvement": significant and diff > 0}
    return ABReport(a=a.name, b=b.name, alpha=alpha, confidence=confidence, domains=domains,
                    overall=overall, unpaired_tasks=unpaired, warnings=warnings)
