"""Forgetting: how held-out domains (not trained on) moved across a post-training round.

The training job evaluates before and after each round and calls

    report = forgetting_report(before, after, trained_domains=["math.add.*"])
    write_forgetting(run_dir, report, name="round-1")     # RUN/forgetting/round-1.json, shown by
                                                          # `posttrain report`

Domains evaluated on the same tasks (the usual case: the same task set, same seeds) get the paired
comparison of `posttrain.evaluation.ab` (paired bootstrap CI, McNemar). Domains whose tasks differ
between the two evaluations get an unpaired difference with Newcombe's interval (from the two
Wilson intervals). A *significant drop* is a held-out domain whose delta is significantly below 0.
"""

from __future__ import annotations

import fnmatch
import json
import time
from collections.abc import Iterable
from math import sqrt
from pathlib import Path
from statistics import fmean
from typing import Any

from posttrain.errors import write_text_atomic
from posttrain.evaluation.ab import compare
from posttrain.evaluation.metrics import wilson_interval
from posttrain.evaluation.result import EvalResult, safe_name

FORGETTING_DIR = "forgetting"
FORGETTING_FORMAT = "posttrain.forgetting/1"


def _newcombe(p1: float, n1: int, p2: float, n2: int, confidence: float) -> tuple[float, float]:
    l1, u1 = wilson_interval(p1, n1, confidence)
    l2, u2 = wilson_interval(p2, n2, confidence)
    d = p2 - p1
    return (d - sqrt((p2 - l2) ** 2 + (u1 - p1) ** 2), d + sqrt((u2 - p2) ** 2 + (p1 - l1) ** 2))


def domain_deltas(before: EvalResult, after: EvalResult, *, alpha: float = 0.05) -> dict[str, dict[str, Any]]:
    """Per-domain pass@1 change (after - before) with its confidence interval, for the domains
    both evaluations scored: paired (bootstrap CI, Holm-corrected McNemar) where they share tasks,
    Newcombe's unpaired interval otherwise. Each row: before, after, delta, ci, paired, p,
    significant_drop, significant (either direction)."""
    conf = after.config.confidence
    sb, sa = before.summary["domains"], after.summary["domains"]
    try:
        paired = compare(before, after, alpha=alpha, confidence=conf,
                         bootstrap_samples=after.config.bootstrap_samples, seed=after.config.seed).domains
    except ValueError:
        paired = {}
    rows: dict[str, dict[str, Any]] = {}
    for dom in sorted(set(sb) & set(sa)):
        if dom in paired:
            v = paired[dom]
            rows[dom] = {"before": v["pass1_a"], "after": v["pass1_b"], "delta": v["diff"], "ci": v["ci"],
                         "paired": True, "p": v["p_holm"], "significant_drop": v["regression"],
                         "significant": v["significant"]}
            continue
        e1, e2 = sb[dom]["pass@1"], sa[dom]["pass@1"]
        if e1["value"] is None or e2["value"] is None:
            continue
        lo, hi = _newcombe(e1["value"], e1["tasks"], e2["value"], e2["tasks"], conf)
        rows[dom] = {"before": e1["value"], "after": e2["value"], "delta": round(e2["value"] - e1["value"], 6),
                     "ci": [round(lo, 6), round(hi, 6)], "paired": False, "p": None,
                     "significant_drop": hi < 0, "significant": hi < 0 or lo > 0}
    return rows


def forgetting_report(before: EvalResult, after: EvalResult, trained_domains: Iterable[str] | str, *,
                      alpha: float = 0.05) -> dict[str, Any]:
    """Per-domain pass@1 deltas (after - before), split into held-out and trained domains.

    `trained_domains`: names or glob patterns (a comma-separated string works too)."""
    patterns = ([p.strip() for p in trained_domains.split(",") if p.strip()]
                if isinstance(trained_domains, str) else list(trained_domains))
    sb, sa = before.summary["domains"], after.summary["domains"]
    rows = domain_deltas(before, after, alpha=alpha)
    for dom, row in rows.items():
        row["trained"] = any(fnmatch.fnmatchcase(dom, p) for p in patterns)
    held = {d: r for d, r in rows.items() if not r["trained"]}
    trained = {d: r for d, r in rows.items() if r["trained"]}
    return {"format": FORGETTING_FORMAT, "before": before.name, "after": after.name,
            "before_policy": before.policy, "after_policy": after.policy,
            "trained_domains": patterns, "created_at": time.time(),
            "held_out": held, "trained": trained,
            "held_out_mean_delta": round(fmean(r["delta"] for r in held.values()), 6) if held else None,
            "trained_mean_delta": round(fmean(r["delta"] for r in trained.values()), 6) if trained else None,
            "forgotten": sorted(d for d, r in held.items() if r["significant_drop"]),
            "only_before": sorted(set(sb) - set(sa)), "only_after": sorted(set(sa) - set(sb))}


def write_forgetting(run_dir: str | Path, report: dict[str, Any], name: str = "") -> Path:
    """Save a forgetting report as `RUN/forgetting/<name>.json` (read by `posttrain report`)."""
    path = Path(run_dir) / FORGETTING_DIR / f"{safe_name(name or report['after'])}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(report, indent=1))
    return path
