"""The report's training sections: what `metrics.jsonl`, `scheduler.json` and `config.json` say.

* learning curves per family and per tier (`family/<f>/reward`, `family/<f>/pass_rate`, and
  `domain/<d>/reward` averaged over a tier's domains);
* the trainer's own curves: loss, KL, gradient norm, entropy (top-level keys of each line);
* the scheduler's shares against its quotas over time (`sched/domains`, written at checkpoints):
  per family, and the per-domain deviation |share - quota|;
* the domains the scheduler took out of training: quarantined (infrastructure errors), retired
  (saturated: every group passed), exhausted (an absolute budget ran out).

Written to stay readable with hundreds of domains: nothing is drawn per domain. Domains are
summed into families (and tiers); per-domain detail goes into top-N tables the page collapses.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from statistics import fmean
from typing import Any

from posttrain.evaluation import figures

METRICS_FILE = "metrics.jsonl"
SCHEDULER_FILE = "scheduler.json"
CURVE_METRICS = ("reward", "pass_rate")
"""the `family/<f>/<metric>` metrics drawn as learning curves, in this order"""
TRAINER_METRICS = ("loss", "kl", "grad_norm", "entropy")
"""the trainer's per-step figures drawn as curves, in this order (those a run logged)"""
OPTIONAL_TRAINER_METRICS = ("replay_drift", "anchor_kl")
"""plotted where the run logged them, never reported missing: how far the replayed successes of
solved domains had slipped at each step (`TrainerConfig.replay_solved`), and the KL to the
reference on the anchored domains' kept samples (`TrainerConfig.kl_anchor_domains`)"""
TOP_N = 25
"""rows of a per-domain table shown before the rest is folded away"""


@dataclass
class MetricsLog:
    """The parseable lines of `metrics.jsonl`, in step order, and how many were skipped."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    bad: int = 0
    no_step: int = 0

    @property
    def notes(self) -> list[str]:
        if not (self.bad or self.no_step):
            return []
        return [f"{METRICS_FILE}: {self.bad} unparseable line(s) and {self.no_step} line(s) without "
                "an integer 'step' were skipped"]


def read_metrics(run: Path) -> MetricsLog | None:
    path = run / METRICS_FILE
    if not path.is_file():
        return None
    log = MetricsLog()
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            log.bad += 1
            continue
        if not isinstance(row, dict) or not isinstance(row.get("step"), int):
            log.no_step += 1
            continue
        log.rows.append(row)
    log.rows.sort(key=lambda r: r["step"])
    return log


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _snapshots(log: MetricsLog | None, final: Any) -> list[tuple[int, dict[str, dict[str, Any]]]]:
    """(step, per-domain scheduler table) at every checkpoint the run logged; `scheduler.json`'s
    table stands in when the log has none (a run from before the tables were logged)."""
    snaps = [(r["step"], r["sched/domains"]) for r in (log.rows if log else [])
             if isinstance(r.get("sched/domains"), dict)]
    if not snaps and isinstance(final, dict) and isinstance(final.get("domains"), dict):
        last = log.rows[-1]["step"] if log and log.rows else 0
        snaps = [(last, final["domains"])]
    return snaps


def _tiers(snaps: list[tuple[int, dict[str, dict[str, Any]]]], final: Any) -> dict[str, str]:
    tiers: dict[str, str] = {}
    for _, table in snaps:
        tiers.update({d: v["tier"] for d, v in table.items() if isinstance(v.get("tier"), str)})
    if isinstance(final, dict) and isinstance(final.get("domains"), dict):
        tiers.update({d: v["tier"] for d, v in final["domains"].items()
                      if isinstance(v, dict) and isinstance(v.get("tier"), str)})
    return tiers


def learning(log: MetricsLog | None, tiers: Mapping[str, str]) -> dict[str, Any]:
    """Reward (and pass rate, when it is not the same curve) per family; reward per tier when
    the run has more than one tier."""
    if log is None:
        return {"note": f"no {METRICS_FILE} in the run directory: no training metrics to plot"}
    curves: dict[str, dict[str, list[tuple[int, float]]]] = {m: {} for m in CURVE_METRICS}
    by_tier: dict[str, list[tuple[int, float]]] = {}
    for row in log.rows:
        per_tier: dict[str, list[float]] = {}
        for key, value in row.items():
            parts = key.split("/")
            if len(parts) != 3 or not _num(value):
                continue
            if parts[0] == "family" and parts[2] in curves:
                curves[parts[2]].setdefault(parts[1], []).append((row["step"], float(value)))
            elif parts[0] == "domain" and parts[2] == "reward" and parts[1] in tiers:
                per_tier.setdefault(tiers[parts[1]], []).append(float(value))
        for tier, values in per_tier.items():
            by_tier.setdefault(tier, []).append((row["step"], fmean(values)))
    notes = list(log.notes)
    # binary rewards make the pass rate the reward: one curve drawn twice says nothing more
    if curves["reward"] and curves["reward"] == curves["pass_rate"]:
        del curves["pass_rate"]
        notes.append("pass rate equals reward at every step (binary rewards): one panel drawn")
    curves = {m: v for m, v in curves.items() if v}
    out: dict[str, Any] = {"notes": notes}
    if not curves:
        out["note"] = f"{METRICS_FILE} has no family/<family>/reward or pass_rate keys"
        return out
    out["figure"] = figures.learning_curves(curves)
    out["families"] = sorted({f for v in curves.values() for f in v})
    if len(by_tier) > 1:
        out["tier_figure"] = figures.learning_curves({"reward": by_tier}, group="tier (mean over its domains)")
    out["tiers"] = sorted(by_tier)
    return out


def trainer(log: MetricsLog | None) -> dict[str, Any]:
    """Loss, KL, gradient norm and entropy per step (the ones the run logged), and the replay's
    drift where the run replayed solved domains."""
    if log is None:
        return {"note": f"no {METRICS_FILE}: no trainer metrics"}
    series = {m: [(r["step"], float(r[m])) for r in log.rows if _num(r.get(m))]
              for m in TRAINER_METRICS + OPTIONAL_TRAINER_METRICS}
    missing = [m for m, v in series.items() if not v and m in TRAINER_METRICS]
    series = {m: v for m, v in series.items() if v}
    out: dict[str, Any] = {"missing": missing}
    if series:
        out["figure"] = figures.trainer_curves(series)
        last = log.rows[-1]
        out["last"] = {m: last.get(m) for m in series}
        out["step"] = last["step"]
    else:
        out["note"] = f"{METRICS_FILE} has none of {', '.join(TRAINER_METRICS)}"
    return out


def _share_key(config: Any) -> tuple[str, str]:
    share_by = "samples"
    if isinstance(config, dict) and isinstance(config.get("scheduler"), dict):
        share_by = str(config["scheduler"].get("share_by", "samples"))
    return share_by, "sample_share" if share_by == "samples" else "cost_share"


def _share_quota(v: Any, key: str) -> tuple[float, float] | None:
    """(share, quota) of one domain's scheduler row, or None where the row lacks them."""
    if not isinstance(v, dict) or not (_num(v.get(key)) and _num(v.get("quota"))):
        return None
    return float(v[key]), float(v["quota"])


def scheduler(run: Path, log: MetricsLog | None, final: Any) -> dict[str, Any]:
    """Shares against quotas over time (per family), the worst domains now, and the domains
    taken out of training (`final`: the parsed `scheduler.json`, or None)."""
    snaps = _snapshots(log, final)
    share_by, key = _share_key(_read_json(run / "config.json"))
    out: dict[str, Any] = {"share_by": share_by, "out": _out_of_training(log, final)}
    if not snaps:
        out["note"] = (f"no per-domain scheduler figures ({METRICS_FILE} 'sched/domains' at checkpoints, "
                       f"or {SCHEDULER_FILE})")
        return out
    families: dict[str, list[tuple[int, float, float]]] = {}
    deviation: list[tuple[int, float, float]] = []
    for step, table in snaps:
        fam: dict[str, list[float]] = {}
        devs = []
        for d, v in table.items():
            if (pair := _share_quota(v, key)) is None:
                continue
            share, quota = pair
            acc = fam.setdefault(d.split(".")[0], [0.0, 0.0])
            acc[0] += share
            acc[1] += quota
            if quota > 0:  # a domain out of training has no quota to keep
                devs.append(abs(share - quota))
        for f, (share, quota) in fam.items():
            families.setdefault(f, []).append((step, share, quota))
        if devs:
            deviation.append((step, fmean(devs), max(devs)))
    step, table = snaps[-1]
    rows = sorted(((d, v.get("tier", "–"), pair[1], pair[0], v.get("samples"), v.get("cost"))
                   for d, v in table.items() if (pair := _share_quota(v, key)) is not None),
                  key=lambda r: -abs(r[3] - r[2]))
    out.update(figure=figures.shares_vs_quotas(families, deviation, share_by) if families else None,
               step=step, snapshots=len(snaps), domains=len(table), top=rows[:TOP_N], rest=rows[TOP_N:],
               deviation=deviation[-1] if deviation else None)
    return out


def _out_of_training(log: MetricsLog | None, final: Any) -> dict[str, list[dict[str, Any]]]:
    """{'quarantined' | 'retired' | 'exhausted': [{domain, why, since}]}: why from
    `scheduler.json`, since = the first step whose metrics line lists the domain."""
    since: dict[tuple[str, str], int] = {}
    for row in log.rows if log else []:
        for kind in ("quarantined", "retired", "exhausted"):
            for d in row.get(f"sched/{kind}") or []:
                since.setdefault((kind, str(d)), row["step"])
    out: dict[str, list[dict[str, Any]]] = {}
    for kind in ("quarantined", "retired", "exhausted"):
        why: dict[str, Any] = {}
        if isinstance(final, dict) and isinstance(final.get(kind), dict):
            why = final[kind]
        names = sorted(set(why) | {d for k, d in since if k == kind})
        out[kind] = [{"domain": d, "why": _why(kind, why.get(d)), "since": since.get((kind, d))} for d in names]
    return out


def _why(kind: str, info: Any) -> str:
    if isinstance(info, str):
        return info
    if not isinstance(info, dict):
        return "–"
    if kind == "quarantined":
        return (f"infrastructure errors {100 * float(info.get('error_rate', 0)):.0f}% of "
                f"{info.get('episodes', '?')} episodes: {str(info.get('last_error', ''))[:160]}")
    if kind == "retired":
        return f"saturated: {info.get('all_pass_groups_in_a_row', '?')} groups in a row all passed"
    return json.dumps(info)[:200]


def sections(run: Path) -> dict[str, Any]:
    """Everything the template's learning, trainer and scheduler sections show."""
    log = read_metrics(run)
    final = _read_json(run / SCHEDULER_FILE)
    tiers = _tiers(_snapshots(log, final), final)
    return {"learning": learning(log, tiers), "trainer": trainer(log), "scheduler": scheduler(run, log, final)}
