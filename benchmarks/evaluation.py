"""Evaluation throughput and report cost.

    .venv/bin/python benchmarks/evaluation.py                 # oracle + the shipped model if present
    .venv/bin/python benchmarks/evaluation.py --torch-tasks 0 # oracle only

Measures, in one run (the machine is shared: compare numbers from the same run, and see the load):

* episodes/s of `run_eval` with the scripted oracle on the default domains (every math and text
  single-answer domain, eval split), 2 workers -- the evaluator's own overhead (episode state
  machine, verifiers, records, summaries with CIs) -- and its CPU per episode
  (`oracle_cpu_us_per_episode`, the median of `--cpu-repeats` runs; to compare two trees, run
  this script in each, alternating, in one session);
* episodes/s with `TorchPolicy` on the shipped tiny model (`models/tiny-base`), when it is there,
  on the domains it was trained on (its `pretrain.json`), 2 workers, sampled (temperature 1);
* seconds to build the HTML report of a run directory holding those evals and an A/B report.

Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "models" / "tiny-base"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", default="math.*,text.*", help="domains of the oracle run")
    ap.add_argument("--per-domain", type=int, default=20, help="eval tasks per domain (oracle)")
    ap.add_argument("--torch-tasks", type=int, default=10, help="eval tasks per domain with the model (0: skip)")
    ap.add_argument("--k", default="1,4", help="pass@k of the model run (n samples = max k)")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--cpu-repeats", type=int, default=6,
                    help="oracle runs timed for CPU per episode (the median is reported)")
    args = ap.parse_args()

    from posttrain.evaluation import EvalConfig, build_report, compare, resolve_policy, resolve_tasks, run_eval

    load_before = os.getloadavg()[0]
    rows, out = [], {"load_avg_1m_before": round(load_before, 2)}
    run_dir = Path(tempfile.mkdtemp(prefix="posttrain-bench-eval-"))

    tasks = resolve_tasks(args.tasks, per_domain=args.per_domain)
    cfg = EvalConfig(k=(1,), workers=args.workers)
    run_eval(resolve_policy("oracle"), tasks[:50], cfg)            # warm-up: imports, caches
    t0 = time.perf_counter()
    oracle = run_eval(resolve_policy("oracle"), tasks, cfg, name="oracle")
    dt = time.perf_counter() - t0
    episodes = oracle.summary["episodes"]
    rows.append(("oracle", len(tasks), episodes, dt, episodes / dt, oracle.summary["macro_pass1"]))
    out["oracle_episodes_per_s"] = round(episodes / dt, 1)
    # CPU per oracle episode (this process and its children: the evaluator's own cost, less
    # sensitive to a shared machine's load than wall time), the median of `--cpu-repeats` runs
    cpu_us = []
    for _ in range(args.cpu_repeats):
        c0 = _cpu_s()
        again = run_eval(resolve_policy("oracle"), tasks, cfg, name="oracle")
        cpu_us.append((_cpu_s() - c0) / again.summary["episodes"] * 1e6)
    out["oracle_cpu_us_per_episode"] = round(statistics.median(cpu_us), 1) if cpu_us else None
    oracle.save_to_run(run_dir)
    wrong = run_eval(resolve_policy("wrong"), tasks, cfg, name="wrong")
    wrong.save_to_run(run_dir)
    compare(oracle, wrong).save_to_run(run_dir)

    if args.torch_tasks > 0 and (MODEL / "config.json").is_file():
        import torch

        torch.set_num_threads(args.threads)
        meta = json.loads((MODEL / "pretrain.json").read_text()) if (MODEL / "pretrain.json").is_file() else {}
        domains = meta.get("config", {}).get("domains", "math.add.d2")
        mtasks = resolve_tasks(domains, per_domain=args.torch_tasks)
        mcfg = EvalConfig(k=EvalConfig.parse_k(args.k), workers=args.workers)
        policy = resolve_policy(str(MODEL))
        run_eval(policy, mtasks[:8], EvalConfig(k=(1,)))               # warm-up
        t0 = time.perf_counter()
        model = run_eval(policy, mtasks, mcfg, name="tiny-base")
        dt = time.perf_counter() - t0
        episodes = model.summary["episodes"]
        rows.append((f"tiny-base (k={args.k}, {args.threads} thread)", len(mtasks), episodes, dt, episodes / dt,
                     model.summary["macro_pass1"]))
        out["torch_episodes_per_s"] = round(episodes / dt, 1)
        out["torch_macro_pass1"] = model.summary["macro_pass1"]
        out["torch_macro_pass_at_max_k"] = _macro(model, max(mcfg.k))
        model.save_to_run(run_dir)
    else:
        out["torch_episodes_per_s"] = None
        print(f"(no model at {MODEL}: the TorchPolicy row is skipped)", file=sys.stderr)

    t0 = time.perf_counter()
    build_report(run_dir)
    out["report_s"] = round(time.perf_counter() - t0, 3)
    out["load_avg_1m_after"] = round(os.getloadavg()[0], 2)

    print(f"{'policy':34} {'tasks':>6} {'episodes':>9} {'seconds':>8} {'episodes/s':>11} {'macro pass@1':>13}")
    for name, n_tasks, eps, secs, rate, p1 in rows:
        print(f"{name:34} {n_tasks:6d} {eps:9d} {secs:8.2f} {rate:11.1f} {p1:13.3f}")
    print(f"{'report (' + str(len(list((run_dir / 'evals').glob('*.json')))) + ' evals, 1 A/B)':34} "
          f"{'':>6} {'':>9} {out['report_s']:8.2f}")
    print(f"load average (1 min): {out['load_avg_1m_before']} before, {out['load_avg_1m_after']} after; "
          f"{os.cpu_count()} CPUs")
    print(json.dumps(out))


def _cpu_s() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _macro(result, k: int) -> float | None:
    vals = [v[f"pass@{k}"]["value"] for v in result.summary["domains"].values() if v[f"pass@{k}"]["value"] is not None]
    return round(sum(vals) / len(vals), 4) if vals else None


if __name__ == "__main__":
    main()
