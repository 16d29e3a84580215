"""What two torch processes on the same cores cost each other, by their thread counts.

    .venv/bin/python benchmarks/colocation.py [--tasks 'code.repair.*,terminal.count.*']
        [--per-domain 2] [--k 8] [--policy models/tiny-agent]

The same `posttrain eval` (tiny-agent, sandboxed multi-turn domains, 8 episodes in flight) runs
alone and in pairs started together, each process with `OMP_NUM_THREADS` torch threads (torch's
intra-op threads; its default is every core). Every process evaluates the same tasks with the same
seeds, so each does the same work. Why it matters: a benchmark that evaluates beside a run
(`benchmarks/breadth.py --focus-tasks`), or a user who evaluates a checkpoint beside training,
puts two such processes on the machine; when their threads outnumber the cores they spin against
each other and both slow down far more than the shared cores explain.

Prints a table (seconds per process, and for each pair its last finish against running the two
one after the other at the full thread count) and a final JSON line: `alone_s` by threads,
`pair_s` by threads pair (the slower process of the pair), `pair_vs_sequential` (the pair's last
finish over twice `alone_s` at every core: < 1 where running them side by side pays).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]


def _start(args: argparse.Namespace, threads: int, out: Path) -> tuple[subprocess.Popen, float]:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    cmd = [sys.executable, "-m", "posttrain.cli", "eval", "--policy", args.policy, "--tasks", args.tasks,
           "--per-domain", str(args.per_domain), "--k", str(args.k), "--workers", str(args.workers),
           "--json", "--run-dir", str(out), "--name", "e"]
    with open(out.with_suffix(".log"), "wb") as log:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    return proc, time.perf_counter()


def run(args: argparse.Namespace, threads: tuple[int, ...], work: Path, label: str) -> list[float]:
    """Start one process per entry of `threads` together; seconds each took to finish."""
    started = [_start(args, t, work / f"{label}-{i}") for i, t in enumerate(threads)]
    took: dict[int, float] = {}
    while len(took) < len(started):  # polled: each process's own finish, whichever ends first
        for i, (proc, t0) in enumerate(started):
            if i not in took and proc.poll() is not None:
                took[i] = time.perf_counter() - t0
                if proc.returncode != 0:
                    raise SystemExit(f"posttrain eval exited {proc.returncode}: see {work / f'{label}-{i}.log'}")
        time.sleep(0.2)
    return [took[i] for i in range(len(started))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tasks", default="code.repair.*,terminal.count.*")
    ap.add_argument("--per-domain", type=int, default=2)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--policy", default=str(ROOT / "models" / "tiny-agent"))
    args = ap.parse_args()
    cores = os.cpu_count() or 1
    table = Table(title=f"two evaluations on {cores} cores: seconds per process")
    for col in ("threads", "process 1 s", "process 2 s", "last finish / sequential"):
        table.add_column(col, justify="right")
    alone: dict[int, float] = {}
    pairs: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="posttrain-colocation-") as tmp:
        work = Path(tmp)
        for t in sorted({cores, 1}, reverse=True):
            (alone[t],) = run(args, (t,), work, f"alone{t}")
            table.add_row(f"{t} alone", f"{alone[t]:.1f}", "", "")
        sequential = 2 * alone[cores]
        half = max(1, cores // 2)
        for pair in sorted({(cores, cores), (cores, half), (half, half)}, reverse=True):
            secs = run(args, pair, work, f"pair{pair[0]}-{pair[1]}")
            pairs[f"{pair[0]}+{pair[1]}"] = max(secs)
            table.add_row(f"{pair[0]} + {pair[1]}", f"{secs[0]:.1f}", f"{secs[1]:.1f}",
                          f"{max(secs) / sequential:.2f}")
    Console().print(table)
    print(json.dumps({"cores": cores, "tasks": args.tasks, "per_domain": args.per_domain, "k": args.k,
                      "alone_s": {str(t): round(s, 1) for t, s in alone.items()},
                      "pair_s": {k: round(s, 1) for k, s in pairs.items()},
                      "pair_vs_sequential": {k: round(s / sequential, 2) for k, s in pairs.items()}}))


if __name__ == "__main__":
    main()
