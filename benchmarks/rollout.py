"""Rollout machinery throughput: oracle episodes per second per family, runner + store overhead
per turn (tool and verifier time excluded), and store writes per second.

    .venv/bin/python benchmarks/rollout.py [--domains-per-family 6] [--tasks 3] [--workers 2]

Every family runs its domains' oracles through the full path (environment, sandbox from a warm
pool, verifier, store) with 2 workers. Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from posttrain.envs import EnvConfig
from posttrain.policies.scripted import ScriptedPolicy
from posttrain.scheduling.engine import WorkItem, run_episodes
from posttrain.sandbox import SandboxPool
from posttrain.storage.store import Store
from posttrain.tasks.registry import families


def spread(items: list, k: int) -> list:
    if len(items) <= k:
        return items
    step = len(items) / k
    return [items[int(i * step)] for i in range(k)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--domains-per-family", type=int, default=6)
    ap.add_argument("--tasks", type=int, default=3, help="tasks per domain")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()

    rows, per_turn_overheads = [], []
    store_writes, store_s = 0, 0.0
    with tempfile.TemporaryDirectory() as tmp, SandboxPool(size=args.workers) as pool:
        store = Store(Path(tmp) / "store.sqlite")
        for family, domains in sorted(families().items()):
            chosen = spread(sorted(domains, key=lambda d: d.name), args.domains_per_family)
            specs = [WorkItem(d, d.task(seed)) for d in chosen for seed in range(args.tasks)]
            done = []
            t0 = time.perf_counter()
            trajs = run_episodes(specs, ScriptedPolicy.oracle(), env_config=EnvConfig(),
                                 sandbox_factory=pool.sandbox, workers=args.workers,
                                 on_result=lambda r: done.append((r.trajectory, r.task, r.workspace_archive)))
            wall = time.perf_counter() - t0
            t1 = time.perf_counter()
            for traj, task, ws in done:
                store.put_trajectory(traj, task, ws)
            store_s += time.perf_counter() - t1
            store_writes += len(done)
            turns = sum(len(t.turns) for t in trajs)
            for t in trajs:
                tm = t.timings
                inner = tm.get("tool_s", 0) + tm.get("verify_s", 0) + tm.get("gen_s", 0)
                per_turn_overheads.append(max(0.0, tm.get("total_s", 0) - inner) / max(1, len(t.turns)))
            passed = sum(bool(t.passed) for t in trajs)
            infra = sum(t.status == "infra_error" for t in trajs)
            rows.append({"family": family, "domains": len(chosen), "episodes": len(trajs), "turns": turns,
                         "passed": passed, "infra_error": infra, "wall_s": round(wall, 3),
                         "episodes_per_s": round(len(trajs) / wall, 2)})
        store.close()

    # Pure runner overhead: single-answer episodes with an exact-match verifier, no sandbox.
    math_domains = sorted(families()["math"], key=lambda d: d.name)[:4]
    specs = [WorkItem(d, d.task(s)) for d in math_domains for s in range(250)]
    t0 = time.perf_counter()
    trajs = run_episodes(specs, ScriptedPolicy.oracle(), workers=1)
    runner_us = (time.perf_counter() - t0) / sum(len(t.turns) for t in trajs) * 1e6

    print(f"{'family':10} {'domains':>7} {'episodes':>8} {'turns':>6} {'passed':>6} {'infra':>5} "
          f"{'wall_s':>7} {'eps/s':>7}")
    for r in rows:
        print(f"{r['family']:10} {r['domains']:>7} {r['episodes']:>8} {r['turns']:>6} {r['passed']:>6} "
              f"{r['infra_error']:>5} {r['wall_s']:>7} {r['episodes_per_s']:>7}")
    overhead_ms = statistics.median(per_turn_overheads) * 1e3
    writes_per_s = store_writes / store_s
    print(f"\nsandboxed episode overhead per turn (total - tool - verify - generation), median: "
          f"{overhead_ms:.2f} ms (includes taking a sandbox from the pool and archiving the workspace)")
    print(f"runner overhead per turn, single-answer episodes without sandbox: {runner_us:.0f} us")
    print(f"store writes: {writes_per_s:.0f} trajectories/s ({store_writes} written)")
    print(f"load average: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    print(json.dumps({
        "episodes_per_s": {r["family"]: r["episodes_per_s"] for r in rows},
        "oracle_pass_rate": round(sum(r["passed"] for r in rows) / max(1, sum(r["episodes"] for r in rows)), 4),
        "infra_errors": sum(r["infra_error"] for r in rows),
        "episode_overhead_ms_per_turn_p50": round(overhead_ms, 3),
        "runner_overhead_us_per_turn": round(runner_us, 1),
        "store_writes_per_s": round(writes_per_s, 1),
        "workers": args.workers,
    }))
    sys.exit(0)


if __name__ == "__main__":
    main()
