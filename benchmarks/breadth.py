"""Hundreds of domains in one run: `configs/breadth.toml` (every domain the model fits), shortened.

    .venv/bin/python benchmarks/breadth.py [--steps 4] [--tasks-per-domain 4] [--samples 4]
    .venv/bin/python benchmarks/breadth.py --config configs/breadth-agent.toml   # with tiny-agent

Runs the job in-process with the overrides below, then reports, from the run directory:

* `domains_trained`: trained domains that got at least one group into an update;
* `infra_error_rate`: infrastructure errors over all episodes of the run (training and evaluation);
* `step_mix_error`: per domain, the largest |its share of a step's groups - its quota| over the
  steps, averaged over trained domains (the quota is its weight's share of the trained tier);
  `step_family_error`: the same per family (the sum of its domains' quotas), the worst step;
* `mean_delta`: pass@1 after - before, averaged over trained domains whose base pass@k >= 0.2;
  `worst_delta`: the smallest such delta; `heldout_delta`: the held-out domains' mean delta;
* `wall_s`: the whole run (evaluations included).

Shortened how: `--steps` trainer steps instead of the config's, `--tasks-per-domain` eval tasks
per domain and `--samples` samples each (and `--group-size` samples per training group), so on a
loaded CPU machine the run takes minutes; the deltas of a few steps are small and noisy (each
domain is seen by a step or two). Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from collections import Counter, defaultdict
from pathlib import Path

from rich.console import Console
from rich.table import Table

from posttrain.pipeline.config import load_config
from posttrain.pipeline.main import Job
from posttrain.pipeline.report import pass_of

ROOT = Path(__file__).resolve().parents[1]


def step_mix(store, run_id: str, quotas: dict[str, float]) -> tuple[float, list[dict[str, int]]]:
    """(step_mix_error, the groups per domain of each step). A group's step is the policy version
    it was generated with (synchronous training: version N feeds step N + 1)."""
    steps: dict[str, Counter] = defaultdict(Counter)
    seen: set[str] = set()
    for t in store.trajectories(run_id=run_id, split="train"):
        if t.status == "infra_error" or t.group_id is None or t.group_id in seen:
            continue
        seen.add(t.group_id)
        steps[t.policy_version or ""][t.domain] += 1
    per_step = [steps[v] for v in sorted(steps, key=_step_number)]
    if not per_step or not quotas:
        return float("nan"), []
    worst = {d: max(abs(c[d] / sum(c.values()) - q) for c in per_step) for d, q in quotas.items()}
    return sum(worst.values()) / len(worst), [dict(c) for c in per_step]


def family_mix(per_step: list[dict[str, int]], quotas: dict[str, float]) -> float:
    """The largest |a family's share of a step's groups - the family's quota| over the steps."""
    fquota: Counter = Counter()
    for d, q in quotas.items():
        fquota[d.split(".")[0]] += q
    worst = 0.0
    for c in per_step:
        fam: Counter = Counter()
        for d, k in c.items():
            fam[d.split(".")[0]] += k
        n = sum(c.values())
        worst = max([worst] + [abs(fam[f] / n - q) for f, q in fquota.items()])
    return worst


def _step_number(version: str) -> int:
    tail = version.rsplit("step-", 1)[-1]
    return int(tail) if tail.isdigit() else -1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=str(ROOT / "configs" / "breadth.toml"))
    ap.add_argument("--runs-dir", default="runs/bench-breadth", help="where the run is written (replaced)")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--tasks-per-domain", type=int, default=4)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=None,
                    help="samples per training group (default: the config's)")
    ap.add_argument("--model", default=None, help="starting model (default: the config's)")
    ap.add_argument("--allow-contamination", action="store_true",
                    help="run even if the contamination guard refuses (reported in the JSON line)")
    args = ap.parse_args()
    runs = Path(args.runs_dir)
    shutil.rmtree(runs, ignore_errors=True)
    overrides = {"runs_dir": str(runs), "steps": args.steps, "checkpoint_every": max(1, args.steps),
                 "eval.tasks_per_domain": args.tasks_per_domain, "eval.samples": args.samples,
                 "logging.backends": []}
    if args.group_size:
        overrides["rollout.group_size"] = args.group_size
    if args.model:
        overrides["model.path"] = args.model
    if args.allow_contamination:
        overrides["allow_contamination"] = True
    cfg = load_config(args.config, overrides)
    if not Path(cfg.model.path).is_absolute():  # the config's paths are relative to the repository
        cfg = load_config(args.config, {**overrides, "model.path": str(ROOT / cfg.model.path)})
    console = Console(force_terminal=False, width=120)
    t0 = time.perf_counter()
    job = Job(cfg, console)
    summary = job.run()
    wall_s = time.perf_counter() - t0

    from posttrain.evaluation.result import EvalResult
    from posttrain.storage.store import Store

    before = EvalResult.load(cfg.run_dir / "evals" / "before.json")
    after = EvalResult.load(cfg.run_dir / "evals" / "after.json")
    k = cfg.eval.n_samples
    trained = [d.name for d in job.train_domains]
    weights = {s: cfg.domains.weights.get(s, 1.0) for s in trained}
    total = sum(weights.values())
    quotas = {d: w / total for d, w in weights.items()}
    with Store.for_run_dir(cfg.run_dir, readonly=True) as store:
        counts = store.counts()
        mix_error, per_step = step_mix(store, cfg.name, quotas)
    served = {d for c in per_step for d in c}

    def delta(name: str) -> float | None:
        p0, p1 = pass_of(before, name, "pass@1"), pass_of(after, name, "pass@1")
        return None if p0 is None or p1 is None else p1 - p0

    learnable = [d for d in trained if (pass_of(before, d, f"pass@{k}") or 0) >= 0.2]
    deltas = [x for x in (delta(d) for d in learnable) if x is not None]
    held = [x for x in (delta(d.name) for d in job.heldout_domains) if x is not None]
    families = Counter(d.split(".")[0] for d in served)
    out = {
        "domains_trained": len(served),
        "domains_selected": len(trained) + len(job.unfit),
        "domains_unfit": len(job.unfit),
        "families": dict(sorted(families.items())),
        "steps": cfg.steps,
        "groups_per_step": cfg.rollout.groups_per_step,
        "infra_error_rate": counts["infra_error"] / counts["episodes"] if counts["episodes"] else None,
        "step_mix_error": round(mix_error, 4),
        "step_family_error": round(family_mix(per_step, quotas), 4),
        "step_families_max": max((len({d.split(".")[0] for d in c}) for c in per_step), default=0),
        "step_families_min": min((len({d.split(".")[0] for d in c}) for c in per_step), default=0),
        "learnable_domains": len(learnable),
        "mean_delta": sum(deltas) / len(deltas) if deltas else None,
        "worst_delta": min(deltas) if deltas else None,
        "heldout_delta": sum(held) / len(held) if held else None,
        "base_pass1": summary.get("base_pass1"), "final_pass1": summary.get("final_pass1"),
        "wall_s": round(wall_s, 1),
        "contamination_overridden": json.loads((cfg.run_dir / "contamination.json").read_text())["overridden"],
    }
    table = Table(title=f"breadth: {len(trained)} trained domains, {cfg.steps} steps (shortened)")
    table.add_column("figure")
    table.add_column("value", justify="right")
    for key, value in out.items():
        table.add_row(key, f"{value:.4f}" if isinstance(value, float) else str(value))
    console.print(table)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
