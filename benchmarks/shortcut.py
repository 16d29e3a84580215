"""Does a policy learn a constant answer instead of the task? A small run that isolates it.

    .venv/bin/python benchmarks/shortcut.py [--runs-dir /tmp/shortcut] [--steps 40] [--seed 0] [--set K=V]

tiny-agent trains 40 steps of 8 groups of 8 on `text.count.l3` and `rg.circuit_logic` (weight
1) and on `text.count.l8` (weight 0.05: few groups, as in a breadth run where hundreds of domains
share the steps); `text.count.l5` is held out. The base and the trained weights are evaluated on
20 eval tasks x 8 samples a domain. Reported per domain, from the stored evaluations: pass@1
before and after, the policy's commonest answer after training and its share of the answers
before and after, and how much of the pass@1 that one answer earns.

Why: with its letters drawn at random, `text.count.l3` answered "0" 45% of the time, and a
40-step breadth run took it from 0.15 to 0.46 pass@1 by answering "0" -- then answered "0" to
115 of 160 samples of the look-alike `text.count.l8`, where "0" is rarely right. `posttrain
tasks check` now calls such a domain guessable, and the project's generators draw their answers
uniformly; this measures what is left of the shortcut. Prints a table and a final JSON line
(`max_mode_share_rise`: the largest rise of a domain's commonest-answer share).
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from posttrain.evaluation.shortcuts import answer_shift, final_answers, largest_rise
from posttrain.pipeline.config import ConfigError, dotted, load_config, parse_set
from posttrain.pipeline.main import Job

ROOT = Path(__file__).resolve().parents[1]

CONFIG = """\
name = "shortcut"
steps = 40
checkpoint_every = 10

[model]
path = "models/tiny-agent"
threads = 2

[domains]
train = ["text.count.l3", "text.count.l8", "rg.circuit_logic"]
weights = {"text.count.l8" = 0.05}
heldout = ["text.count.l5"]

[rollout]
group_size = 8
groups_per_step = 8
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
[scheduler.adaptive]
enabled = false
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs-dir", default="/tmp/posttrain-shortcut")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a run-config field, as `posttrain run --set` (e.g. trainer.collapse_penalty=1)")
    args = ap.parse_args()
    try:
        sets = parse_set(args.set)
    except ConfigError as e:
        ap.error(str(e))
    runs = Path(args.runs_dir)
    shutil.rmtree(runs, ignore_errors=True)
    runs.mkdir(parents=True)
    config = runs / "shortcut.toml"
    config.write_text(CONFIG)
    flags = dotted({"runs_dir": str(runs), "steps": args.steps, "logging.backends": [],
                    "model.path": str(ROOT / "models" / "tiny-agent"), "seed": args.seed})
    cfg = load_config(config, {**sets, **flags})  # the flags win
    t0 = time.perf_counter()
    Job(cfg, Console(force_terminal=False, width=120)).run()
    wall_s = time.perf_counter() - t0

    from posttrain.storage.store import Store

    with Store.for_run_dir(cfg.run_dir, readonly=True) as store:
        shift = answer_shift(final_answers(store, "eval:before"), final_answers(store, "eval:after"))
    table = Table("domain", "pass@1 before", "after", "commonest answer after", "its share before",
                  "after", "pass@1 it earns after", title="the commonest answer, before and after training")
    for domain, r in shift.items():
        table.add_row(domain, f"{r['pass1_before']:.3f}", f"{r['pass1_after']:.3f}", repr(r["answer"]),
                      f"{r['share_before']:.3f}", f"{r['share_after']:.3f}", f"{r['pass1_by_answer']:.3f}")
    Console().print(table)
    worst, rise = largest_rise(shift)
    print(json.dumps({"steps": args.steps, "seed": args.seed, "set": args.set, "domains": shift,
                      "max_mode_share_rise": rise, "max_mode_share_rise_domain": worst,
                      "wall_s": round(wall_s, 1)}))


if __name__ == "__main__":
    main()
