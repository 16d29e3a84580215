"""Does post-training work? The default job, then a second round from the first one's checkpoint.

    .venv/bin/python benchmarks/post_training.py [--runs-dir runs/bench] [--steps N]

Round 1 is exactly `posttrain run` with the embedded default config (the shipped base model, the
default mix, held-out domains for forgetting). Round 2 runs the same config from round 1's final
checkpoint. Reports, on the held-out eval split:

* `base_pass1`, `base_pass8`: the base model's sampled pass@1 and pass@8, averaged over trained domains;
* `final_pass1`: after round 1 (target >= 0.9 x base_pass8);
* `untrained_delta`: pass@1 change on the held-out domains never trained on (target >= -0.01);
* `round2_pass1`: after round 2 (target >= final_pass1).

Budgets are trainer steps, not seconds, so the numbers do not depend on machine load; the wall
times are printed for reference. Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from pathlib import Path

from rich.console import Console

from posttrain.pipeline.config import load_config
from posttrain.pipeline.main import Job


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs-dir", default="runs/bench", help="where both rounds are written (replaced)")
    ap.add_argument("--steps", type=int, default=None, help="trainer steps per round (default: the config's)")
    args = ap.parse_args()
    runs = Path(args.runs_dir)
    shutil.rmtree(runs, ignore_errors=True)
    console = Console(force_terminal=False)
    overrides = {"runs_dir": str(runs)}
    if args.steps is not None:
        overrides["steps"] = args.steps

    t0 = time.perf_counter()
    r1 = Job(load_config(None, {**overrides, "name": "round1"}), console).run()
    ckpt = json.loads((runs / "round1" / "checkpoints" / "latest.json").read_text())["path"]
    r2 = Job(load_config(None, {**overrides, "name": "round2", "model.path": ckpt}), console).run()
    wall = time.perf_counter() - t0

    k = load_config(None, overrides).eval.samples
    out = {
        "base_pass1": r1["base_pass1"], "base_pass8": r1[f"base_pass{k}"],
        "final_pass1": r1["final_pass1"], "untrained_delta": r1.get("untrained_delta"),
        "round2_pass1": r2["final_pass1"],
        "round1_train_s": r1["train_s"], "round1_total_s": r1["total_s"],
        "round2_total_s": r2["total_s"], "steps": r1["steps"],
    }
    out["final_over_base_pass8"] = (out["final_pass1"] / out["base_pass8"]) if out["base_pass8"] else None
    rows = [("base pass@1 (trained domains)", out["base_pass1"], ""),
            (f"base pass@{k} (trained domains)", out["base_pass8"], ""),
            ("round 1 pass@1", out["final_pass1"], f">= 0.9 x base pass@{k} = {0.9 * out['base_pass8']:.3f}"),
            ("held-out domains, pass@1 change", out["untrained_delta"], ">= -0.01"),
            ("round 2 pass@1", out["round2_pass1"], f">= round 1 = {out['final_pass1']:.3f}")]
    print(f"\n{'measure':40} {'value':>8}  target")
    for name, value, target in rows:
        print(f"{name:40} {('-' if value is None else f'{value:.3f}'):>8}  {target}")
    print(f"round 1: {out['round1_total_s']:.0f}s ({out['round1_train_s']:.0f}s training); round 2: "
          f"{out['round2_total_s']:.0f}s; both {wall:.0f}s; load average {os.getloadavg()[0]:.2f}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
