"""Tasks verified per second through the oracle path, for the code, terminal and geometry families.

    .venv/bin/python benchmarks/family_oracles.py [--families code,terminal,geometry] [--seeds 1]

For every domain of a family and every seed, the oracle is played through the full environment
path (`posttrain.envs.play_actions`: sandbox, tool calls, kill, verifier) in two ways:

* `fresh`: a new default sandbox per episode, as the environments do;
* `reused`: one sandbox for the family, its workspace restored from a snapshot between episodes,
  opened with the family's heavy modules preloaded (numpy, manifold3d, trimesh for geometry).

Prints a table (one row per family and mode) and a final JSON line. The machine is shared and
noisy: compare the two modes of the same run, not numbers across runs.
"""

from __future__ import annotations

import argparse
import importlib
import json
import time

from posttrain.envs import play_actions
from posttrain.sandbox import open_sandbox

PRELOAD = {"geometry": ("numpy", "manifold3d", "trimesh")}


def tasks_of(family: str, seeds: int):
    module = importlib.import_module(f"posttrain.tasks.families.{family}")
    out = []
    for d in module.domains():
        for seed in range(seeds):
            for split in ("train", "eval"):
                try:
                    out.append((d, d.task(seed, split)))
                    break
                except ValueError:  # an imported single task lives in one split only
                    continue
    return out


def run(family: str, seeds: int, mode: str) -> dict:
    tasks = tasks_of(family, seeds)
    passed = 0
    t0 = time.perf_counter()
    if mode == "fresh":
        for d, task in tasks:
            passed += play_actions(d, task, d.oracle(task)).passed
    else:
        with open_sandbox(preload=PRELOAD.get(family, ())) as sb:
            clean = sb.snapshot()
            for d, task in tasks:
                sb.restore(clean)
                passed += play_actions(d, task, d.oracle(task), sandbox=sb).passed
    wall = time.perf_counter() - t0
    return {"tasks": len(tasks), "passed": passed, "wall_s": round(wall, 2),
            "tasks_per_s": round(len(tasks) / wall, 2)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--families", default="code,terminal,geometry")
    ap.add_argument("--seeds", type=int, default=1)
    args = ap.parse_args()
    results: dict[str, dict] = {}
    for family in args.families.split(","):
        results[family] = {mode: run(family, args.seeds, mode) for mode in ("fresh", "reused")}
    print(f"{'family':<10} {'mode':<7} {'tasks':>5} {'passed':>6} {'wall_s':>7} {'tasks/s':>8}")
    for family, modes in results.items():
        for mode, r in modes.items():
            print(f"{family:<10} {mode:<7} {r['tasks']:>5} {r['passed']:>6} {r['wall_s']:>7} {r['tasks_per_s']:>8}")
    print(json.dumps({"seeds": args.seeds, "results": results,
                      "reused_vs_fresh": {f: round(m["reused"]["tasks_per_s"] / m["fresh"]["tasks_per_s"], 2)
                                          for f, m in results.items()}}))


if __name__ == "__main__":
    main()
