"""Does agentic post-training work? The agentic job (`configs/agentic.toml`), measured.

    .venv/bin/python benchmarks/agentic.py [--runs-dir runs/bench-agentic] [--steps N]

Runs exactly `posttrain run configs/agentic.toml` (tiny-agent, GRPO on sandboxed multi-turn
domains of three families, four held out) and reports, on the eval split:

* `base_pass1`, `base_pass8`: tiny-agent's sampled pass@1 and pass@8, averaged over the trained
  domains;
* `final_pass1`: after the job (target >= 0.8 x base_pass8);
* `heldout_delta`: pass@1 change on the held-out domains (target >= -0.01);
* `tool_calls_p50`, `turns_p50`: per training episode (targets >= 2);
* `wall_s`: the whole job, both evaluations included (target <= 1800 on the 2-core machine);
* `corpus_domains`: the domains of tiny-agent's pretraining corpus (`pretrain.json`; >= 100).

Budgets are trainer steps, not seconds; the load average is printed beside the wall time.
Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import time
from pathlib import Path

from rich.console import Console

from posttrain.pipeline.config import load_config
from posttrain.pipeline.main import Job
from posttrain.storage.store import Store

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "agentic.toml"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs-dir", default="runs/bench-agentic", help="where the run is written (replaced)")
    ap.add_argument("--steps", type=int, default=None, help="trainer steps (default: the config's)")
    ap.add_argument("--model", default=None,
                    help="the base model's directory (default: the config's, models/tiny-agent); "
                         "a candidate is measured before its weights are committed")
    ap.add_argument("--seed", type=int, default=None,
                    help="the run's seed (default: the config's): another draw of the same job")
    args = ap.parse_args()
    runs = Path(args.runs_dir)
    shutil.rmtree(runs, ignore_errors=True)
    overrides: dict = {"runs_dir": str(runs)}
    if args.steps is not None:
        overrides["steps"] = args.steps
    if args.seed is not None:
        overrides["seed"] = args.seed
    if args.model is not None:
        overrides["model.path"] = args.model
    config = load_config(CONFIG, overrides)
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    result = Job(config, Console(force_terminal=False)).run()
    wall = time.perf_counter() - t0

    turns, calls = [], []
    with Store.for_run_dir(config.run_dir) as store:
        for t in store.trajectories(run_id=config.name, split="train"):
            if t.trainable:
                turns.append(len(t.turns))
                calls.append(sum(len(u.tool_calls) for u in t.turns))
    k = config.eval.samples
    pretrain = json.loads((Path(config.model.path) / "pretrain.json").read_text())
    out = {
        "base_pass1": result["base_pass1"], "base_pass8": result[f"base_pass{k}"],
        "final_pass1": result["final_pass1"], "heldout_delta": result.get("untrained_delta"),
        "tool_calls_p50": statistics.median(calls) if calls else None,
        "turns_p50": statistics.median(turns) if turns else None,
        "wall_s": round(wall, 1), "corpus_domains": pretrain.get("corpus_domains"),
        "steps": result["steps"], "train_s": result["train_s"],
        "load_avg": [round(load0, 2), round(os.getloadavg()[0], 2)],
    }
    base8 = out["base_pass8"] or 0.0
    rows = [("base pass@1 (trained domains)", out["base_pass1"], ""),
            (f"base pass@{k} (trained domains)", out["base_pass8"], ""),
            ("final pass@1", out["final_pass1"], f">= 0.8 x base pass@{k} = {0.8 * base8:.3f}"),
            ("held-out domains, pass@1 change", out["heldout_delta"], ">= -0.01"),
            ("tool calls per episode, median", out["tool_calls_p50"], ">= 2"),
            ("turns per episode, median", out["turns_p50"], ">= 2"),
            ("wall seconds, whole job", out["wall_s"], "<= 1800"),
            ("corpus domains", out["corpus_domains"], ">= 100")]
    print(f"\n{'measure':40} {'value':>8}  target")
    for name, value, target in rows:
        print(f"{name:40} {('-' if value is None else f'{value:.3f}'):>8}  {target}")
    print(f"load average {out['load_avg'][0]} at the start, {out['load_avg'][1]} at the end")
    shown = before_after(config, cfg_train=set(config.domains.train))
    if shown:
        print(f"\none episode of the same task before and after training: {shown}")
    print(json.dumps(out))


def render(t) -> str:
    """An episode as the model saw it: each observation, then the model's action."""
    lines = [f"### {t.policy_version}: {'passed' if t.verdict and t.verdict.passed else 'failed'}"
             f" (reward {t.reward})", ""]
    for u in t.turns:
        lines += ["observation:", "```", u.observation.rstrip(), "```", "action:", "```", u.action.rstrip(), "```"]
    if t.verdict is not None and t.verdict.details:
        lines.append(f"verdict details: {json.dumps(dict(t.verdict.details))[:400]}")
    return "\n".join(lines)


def before_after(config, cfg_train: set[str]) -> str | None:
    """Write `transcript.md` in the run directory: the same eval task and sample, sampled by the
    base model (failed) and by the trained one (passed), preferring an episode of 2+ turns."""
    with Store.for_run_dir(config.run_dir) as store:
        # an evaluation's samples of one task are groups of one: the sample index is the group id's
        before = {(t.task_key, t.group_id): t for t in store.trajectories(run_id="eval:before")}
        after = {(t.task_key, t.group_id): t for t in store.trajectories(run_id="eval:after")}
    pairs = [(b, after[k]) for k, b in before.items() if k in after and b.domain in cfg_train
             and b.verdict is not None and not b.verdict.passed
             and after[k].verdict is not None and after[k].verdict.passed]
    if not pairs:
        return None
    pairs.sort(key=lambda p: (-min(len(p[1].turns), 3), p[0].domain, p[0].task_key, p[0].group_id))
    b, a = pairs[0]
    text = "\n\n".join([f"## {a.domain}, task {a.task_key}, sample {a.group_id.rsplit(':', 1)[-1]}",
                         render(b), render(a)])
    path = Path(config.run_dir) / "transcript.md"
    path.write_text(text + "\n")
    print(text)
    return str(path)


if __name__ == "__main__":
    main()
