"""A synthetic run directory with hundreds of domains, written directly (no training, no
episodes): what the report tests read. Shared by the report tests; no tests here."""

from __future__ import annotations

import json
import random
from pathlib import Path

from posttrain.evaluation import EvalConfig
from posttrain.evaluation.records import Sample, TaskRecord
from posttrain.evaluation.result import EvalResult

FAMILIES = ("math", "text", "code", "docs", "terminal", "geometry", "rg")


def domain_names(n: int) -> list[str]:
    return [f"{FAMILIES[i % len(FAMILIES)]}.op{i // len(FAMILIES)}.l{i % 3}" for i in range(n)]


def synthetic_eval(name: str, policy: str, pass_rate: dict[str, float], tasks: int, samples: int,
                   created: float) -> EvalResult:
    """Every domain's tasks passed at about `pass_rate[domain]`, paired across calls by task."""
    records = []
    for d, p in pass_rate.items():
        for t in range(tasks):
            rng = random.Random(f"{d}/{t}")  # the same task draws the same coins on both sides...
            coins = [rng.random() for _ in range(samples)]
            records.append(TaskRecord(hash=f"{d}-{t}", key=f"{d}:eval:{t}", domain=d, family=d.split(".")[0],
                                      env="single", split="eval", seed=t,
                                      samples=[Sample(index=j, status="completed", passed=c < p, score=float(c < p),
                                                      turns=1, prompt_tokens=30, output_tokens=8, gen_s=0.01)
                                               for j, c in enumerate(coins)]))
    # ...so a domain whose rate did not change has identical outcomes: a paired change of exactly 0
    return EvalResult(name=name, policy=policy, config=EvalConfig(k=(1,)), records=records, created_at=created)


def build(run: Path, n_domains: int = 315, steps: int = 60, checkpoint_every: int = 10,
          tasks: int = 12, samples: int = 4) -> dict[str, object]:
    """Write evals/before.json, evals/after.json, metrics.jsonl, scheduler.json and config.json
    for `n_domains` domains; returns what the test may check against (names, moved domains)."""
    names = domain_names(n_domains)
    rng = random.Random(0)
    before = {d: rng.choice([0.0, 0.0, 0.2, 0.5, 0.8, 1.0]) for d in names}
    gains = names[3::25]                                   # these learn a lot...
    drops = [d for d in names[5::31] if d not in gains]    # ...these forget
    after = dict(before)
    for d in gains:
        after[d] = min(1.0, before[d] + 0.6)
    for d in drops:
        after[d] = max(0.0, before[d] - 0.5)
    synthetic_eval("before", "base", before, tasks, samples, 1000.0).save_to_run(run)
    synthetic_eval("after", "synthetic/step-60", after, tasks, samples, 2000.0).save_to_run(run)

    tiers = {d: ("background" if d.startswith("rg.") else "train") for d in names}
    quarantined, retired, exhausted = names[-3:], names[-5:-3], names[-9:-5]
    out = set(quarantined) | set(retired) | set(exhausted)
    weight = {d: (2.0 if d.startswith("math.") else 1.0) for d in names}

    def table(step: int) -> dict[str, dict[str, object]]:
        live = [d for d in names if d not in out or step < steps // 2]
        totals = {t: sum(weight[d] for d in live if tiers[d] == t) for t in set(tiers.values())}
        rows = {}
        for d in names:
            quota = weight[d] / totals[tiers[d]] if d in live else 0.0
            jitter = 1 + 0.3 * (random.Random(f"{d}/{step}").random() - 0.5) * (10 / step)
            rows[d] = {"tier": tiers[d], "quota": round(quota, 6), "sample_share": round(quota * jitter, 6),
                       "cost_share": round(quota, 6), "samples": step * 8, "cost": step * 0.5}
        return rows

    with open(run / "metrics.jsonl", "w") as f:
        for step in range(1, steps + 1):
            row: dict[str, object] = {"step": step, "loss": 0.5 / step, "kl": 0.001 * step, "grad_norm": 1 + 1 / step,
                                      "entropy": 2.0 - step / steps, "reward_mean": step / steps}
            for i, fam in enumerate(FAMILIES):
                row[f"family/{fam}/reward"] = min(1.0, 0.1 * i + step / (2 * steps))
                row[f"family/{fam}/pass_rate"] = row[f"family/{fam}/reward"]  # binary rewards
            for d in names[step % 7::7][:30]:  # a step's groups come from some domains only
                row[f"domain/{d}/reward"] = 0.5
            row["sched/quarantined"] = quarantined if step >= steps // 2 else []
            row["sched/retired"] = retired if step >= steps // 2 else []
            row["sched/exhausted"] = exhausted if step >= steps // 2 else []
            if step % checkpoint_every == 0:
                row["sched/domains"] = table(step)
            f.write(json.dumps(row) + "\n")
    (run / "scheduler.json").write_text(json.dumps({
        "quarantined": {d: {"error_rate": 0.6, "episodes": 20, "last_error": "sandbox: OSError: boom"}
                        for d in quarantined},
        "retired": {d: {"all_pass_groups_in_a_row": 8} for d in retired},
        "exhausted": {d: "max_samples 400 reached" for d in exhausted},
        "domains": table(steps)}))
    (run / "config.json").write_text(json.dumps({"name": "synthetic", "scheduler": {"share_by": "samples"}}))
    return {"names": names, "gains": gains, "drops": drops, "quarantined": quarantined,
            "retired": retired, "exhausted": exhausted}
