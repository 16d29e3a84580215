"""How fast `posttrain tasks check` verifies tasks, with 1 and 2 worker processes.

    .venv/bin/python benchmarks/tasks_check.py [--per-domain 5] [--domains 'math.*,text.*']
    .venv/bin/python benchmarks/tasks_check.py --domains 'rg.*' --per-domain 1 --guess-tasks 200

Prints a table (one row per worker count and family) and a final JSON line. The machine is
shared and noisy: compare the two worker counts of the same run, not numbers across runs.
"""

from __future__ import annotations

import argparse
import json
import time

from posttrain.scheduling.domain_check import check_domains
from posttrain.tasks import registry


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--per-domain", type=int, default=5)
    ap.add_argument("--domains", default="math.*,text.*,docs.finance.*,rg.*",
                    help="glob patterns (default: every domain graded without a sandbox)")
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--guess-tasks", type=int, default=0,
                    help="the constant-answer probe and split comparison on this many train tasks "
                         "(and as many eval ones) of each domain, as `posttrain tasks check --guess-tasks`")
    args = ap.parse_args()
    domains = registry.match_domains(args.domains)
    # Warm-up outside the timed runs: imports and reasoning-gym dataset objects load once.
    check_domains(domains, per_domain=1)
    rows, results = [], {}
    for workers in (int(w) for w in args.workers.split(",")):
        t0 = time.perf_counter()
        report = check_domains(domains, per_domain=args.per_domain, workers=workers,
                               guess_tasks=args.guess_tasks)
        wall = time.perf_counter() - t0
        results[workers] = {"wall_s": round(wall, 2), "tasks": report.tasks,
                            "tasks_per_s": round(report.tasks / wall, 1), "failures": len(report.failures)}
        for fam, checks in sorted(report.by_family().items()):
            rows.append((workers, fam, len(checks), sum(c.tasks for c in checks), sum(c.seconds for c in checks)))
    print(f"{'workers':>7} {'family':<8} {'domains':>7} {'tasks':>6} {'cpu_s':>8}")
    for w, fam, n, tasks, secs in rows:
        print(f"{w:>7} {fam:<8} {n:>7} {tasks:>6} {secs:>8.2f}")
    for w, r in results.items():
        print(f"workers={w}: {r['tasks']} tasks in {r['wall_s']} s = {r['tasks_per_s']} tasks/s, "
              f"{r['failures']} failures")
    # from the walls, not the rounded rates (0.1 and 0.3 tasks/s would read 3x)
    speedup = (results[2]["tasks"] / results[2]["wall_s"]) / (results[1]["tasks"] / results[1]["wall_s"]) \
        if {1, 2} <= set(results) else None
    print(json.dumps({"per_domain": args.per_domain, "guess_tasks": args.guess_tasks, "domains": len(domains),
                      "runs": results, "speedup_2_vs_1": round(speedup, 2) if speedup else None}))


if __name__ == "__main__":
    main()
