"""The RL recipe on the shipped tiny model: rounds of the main job, each from the last checkpoint.

    .venv/bin/python models/recipe.py                          # base eval, round 1, round 2
    .venv/bin/python models/recipe.py --steps 20 --rounds 1 --eval-tasks 10

Round 1 is `posttrain run` with the embedded default config (the default mix, the held-out
domains, GRPO on the scheduler with its adaptive domain weights); round k+1 is the same job
started from round k's final checkpoint (a new trainer and optimizer), so the versions read
tiny-base -> round1/step-N -> round2/step-N. Everything is the library's: this script only chains
the rounds and prints pass@1 per domain before and after each (eval split, seeded), then one JSON
line (the numbers `models/README.md` reports). The budget is counted in steps, not seconds.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from rich.console import Console

from posttrain.pipeline.config import load_config
from posttrain.pipeline.main import Job


def _pass1(result, name: str, k: int = 1) -> float | None:
    entry = result.summary["domains"].get(name, {}).get(f"pass@{k}")
    return None if entry is None else entry["value"]


def main(argv: list[str] | None = None) -> dict:
    from posttrain.evaluation import EvalResult

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs-dir", default="runs/recipe", help="round<k> run directories go here")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=None, help="trainer steps per round (default: the config's)")
    ap.add_argument("--eval-tasks", type=int, default=None, help="eval-split tasks per domain")
    ap.add_argument("--model", default=None, help="starting model (default: models/tiny-base)")
    args = ap.parse_args(argv)
    overrides: dict = {"runs_dir": args.runs_dir}
    for key, value in (("steps", args.steps), ("eval.tasks_per_domain", args.eval_tasks),
                       ("model.path", args.model)):
        if value is not None:
            overrides[key] = value
    console = Console(force_terminal=False, width=120)
    t0 = time.perf_counter()
    rounds, results = [], []
    start = overrides.get("model.path")
    for r in range(1, args.rounds + 1):
        cfg = load_config(None, {**overrides, "name": f"round{r}", **({"model.path": start} if start else {})})
        summary = Job(cfg, console).run()
        run = cfg.run_dir
        start = json.loads((run / "checkpoints" / "latest.json").read_text())["path"]
        results.append((EvalResult.load(run / "evals" / "before.json"), EvalResult.load(run / "evals" / "after.json")))
        rounds.append({"round": r, "checkpoint": start, **summary})
    k = cfg.eval.samples
    names = sorted(results[0][0].summary["domains"], key=lambda n: (n not in cfg.domains.train, n))
    fmt = lambda v: "    -" if v is None else f"{v:5.3f}"  # noqa: E731
    print(f"\n{'domain':20s} base p@1 base p@{k} " + " ".join(f"r{i + 1} p@1" for i in range(len(rounds))))
    for name in names:
        base = results[0][0]
        row = " ".join(f"{fmt(_pass1(after, name)):>6s}" for _, after in results)
        tag = "" if name in cfg.domains.train else "  (held out)"
        print(f"{name:20s} {fmt(_pass1(base, name)):>8s} {fmt(_pass1(base, name, k)):>8s} {row}{tag}")
    out = {"rounds": rounds, "wall_s": round(time.perf_counter() - t0, 1)}
    Path(args.runs_dir).mkdir(parents=True, exist_ok=True)
    (Path(args.runs_dir) / "recipe.json").write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
