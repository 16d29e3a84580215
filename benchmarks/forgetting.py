"""Does a domain the base model already solves survive training on its neighbours? A small run
that isolates the forgetting the 20-step breadth run showed.

    .venv/bin/python benchmarks/forgetting.py [--runs-dir /tmp/forgetting] [--steps 20] [--seed 0]
        [--set trainer.replay_solved=4 ...]

tiny-agent trains 20 steps of 16 groups of 8 on the terminal domains the breadth run trained most
(`grep`, `count`, `text.sort-numeric`, `text.csv-sum`, `archive.tar`, `find.empty`) and on the
`terminal.files` ones (`concat` 0.96 pass@1, `rename-ext` 0.99, `move` 0.03), with the breadth
config's trainer and adaptive sampling. In the breadth run `terminal.files.concat` went from 0.96
to 0.52 pass@1 (its command degenerated into a loop of `done > full.txt`) after 2 groups of its
own in 20 steps: a solved domain's groups all pass, give GRPO no gradient, its weight falls to
the floor and among ~330 domains it is hardly sampled -- nothing in the loss holds it while its
neighbours' updates move the shell commands it shares with them. Here the two solved domains
weigh 0.1 and the starvation guard is off, so that they are as rare as there: ~2 groups each in
20 steps of 16. (A per-domain concurrency limit the step cannot be filled within -- 4 episodes a
domain, 13 domains, 128 episodes a step -- would seat every domain every step whatever its
weight, since the generator is never left idle while a domain can go; the limit here is 16.)

The base and the trained weights are evaluated on 20 eval tasks x 8 samples a domain. Reported
per domain: pass@1 before and after and the delta, and how many training groups it had.
`--set KEY=VALUE` overrides a run-config field (the value read as JSON where it parses), e.g.
`--set trainer.replay_solved=4` to replay the kept all-pass groups. Prints a table and a final
JSON line: `worst_delta`, `saturated_delta` (the mean delta of the domains at >= 0.8 pass@1
before), `trained_delta` (the others'), `replayed_share` (replayed trajectories over the samples
the steps' losses held) and `update_s` (the trainer's update time, summed over steps).
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from posttrain.evaluation.shortcuts import final_answers
from posttrain.pipeline.config import ConfigError, dotted, load_config, parse_set
from posttrain.pipeline.main import Job

ROOT = Path(__file__).resolve().parents[1]

SATURATED = 0.8
"""pass@1 before training at or above which a domain counts as already solved"""

CONFIG = """\
name = "forgetting"
steps = 20
checkpoint_every = 10

[model]
path = "models/tiny-agent"
threads = 2

[domains]
train = ["terminal.grep.to-file", "terminal.grep.level-counts", "terminal.text.sort-numeric",
         "terminal.count.words", "terminal.count.level-lines", "terminal.count.unique-ips",
         "terminal.count.files", "terminal.archive.tar", "terminal.text.csv-sum",
         "terminal.find.empty", "terminal.files.concat", "terminal.files.rename-ext",
         "terminal.files.move"]
heldout = []
weights = {"terminal.files.concat" = 0.1, "terminal.files.rename-ext" = 0.1}

[rollout]
group_size = 8
groups_per_step = 16
max_tokens = 160
temperature = 1.0

[trainer]
lr = 2e-4
ppo_epochs = 2
loss_agg = "sequence"
kl_beta = 0.2

[eval]
tasks_per_domain = 20
samples = 8
temperature = 1.0

[scheduler]
workers = 8
max_staleness = 0
share_by = "samples"
[scheduler.domains."terminal.*"]
max_concurrency = 16

[scheduler.adaptive]
window = 4
min_groups = 1
floor = 0.1
prior_groups = 4
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs-dir", default="/tmp/posttrain-forgetting")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a run-config field, as `posttrain run --set` (a TOML dotted key and value)")
    args = ap.parse_args()
    try:
        overrides = parse_set(args.set)
    except ConfigError as e:
        ap.error(str(e))
    runs = Path(args.runs_dir)
    shutil.rmtree(runs, ignore_errors=True)
    runs.mkdir(parents=True)
    config = runs / "forgetting.toml"
    config.write_text(CONFIG)
    fixed = {"runs_dir": str(runs), "steps": args.steps, "logging.backends": [],
             "model.path": str(ROOT / "models" / "tiny-agent"), "seed": args.seed, "scheduler.starvation_s": None}
    cfg = load_config(config, {**dotted(fixed), **overrides})
    t0 = time.perf_counter()
    Job(cfg, Console(force_terminal=False, width=120)).run()
    wall_s = time.perf_counter() - t0

    shown = {".".join(k): v for k, v in overrides.items()}
    print(json.dumps({"steps": args.steps, "seed": args.seed, "overrides": shown,
                      **figures(cfg.run_dir, cfg.name), "wall_s": round(wall_s, 1)}))


def figures(run_dir: Path, run_id: str) -> dict:
    """Per-domain pass@1 before / after and training groups of a finished run, printed as a table;
    the summary figures of the final JSON line."""
    from posttrain.storage.store import Store

    rates: dict[str, dict[str, float]] = {}
    groups: dict[str, set[str]] = {}
    with Store.for_run_dir(run_dir, readonly=True) as store:
        for name in ("before", "after"):
            for domain, answers in final_answers(store, f"eval:{name}").items():
                rates.setdefault(domain, {})[name] = sum(p for _, p in answers) / len(answers)
        for t in store.trajectories(run_id=run_id):
            groups.setdefault(t.domain, set()).add(t.group_id)
    table = Table("domain", "pass@1 before", "after", "delta", "groups trained",
                  title="forgetting: pass@1 before and after")
    domains = {}
    for domain in sorted(rates, key=lambda d: -rates[d].get("before", 0.0)):
        before, after = rates[domain].get("before", 0.0), rates[domain].get("after", 0.0)
        n = len(groups.get(domain, ()))
        domains[domain] = {"before": round(before, 4), "after": round(after, 4),
                           "delta": round(after - before, 4), "groups": n}
        table.add_row(domain, f"{before:.3f}", f"{after:.3f}", f"{after - before:+.3f}", str(n))
    Console().print(table)
    saturated = [r["delta"] for r in domains.values() if r["before"] >= SATURATED]
    trained = [r["delta"] for r in domains.values() if r["before"] < SATURATED]
    worst = min(domains, key=lambda d: domains[d]["delta"]) if domains else None
    # the paired A/B of the run's own evaluations (same tasks and seeds; exact McNemar, Holm over
    # the domains): which domains the trained weights lost significantly
    from posttrain.evaluation.ab import compare
    from posttrain.evaluation.result import EvalResult

    ab = compare(EvalResult.load(run_dir / "evals" / "before.json"), EvalResult.load(run_dir / "evals" / "after.json"))
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {
        "domains": domains,
        "worst_delta": domains[worst]["delta"] if worst else None, "worst_domain": worst,
        "saturated_delta": sum(saturated) / len(saturated) if saturated else None,
        "trained_delta": sum(trained) / len(trained) if trained else None,
        "significant_regressions": sorted(d for d, v in ab.domains.items() if v["regression"]),
        "significant_improvements": sum(bool(v["improvement"]) for v in ab.domains.values()),
        # the replayed trajectories' share of what the steps' losses held (a cost measure)
        "replayed_share": (sum(m.get("replay_trajectories", 0) for m in metrics)
                           / max(sum(m.get("samples", 0) for m in metrics), 1)),
        "update_s": round(sum(m.get("step_s", 0.0) for m in metrics), 1)}

if __name__ == "__main__":
    main()
