"""Rollout machinery throughput: oracle episodes per second per family, with sandboxes fresh per
episode and reset between episodes, side by side; runner + store overhead per turn (tool and
verifier time excluded), and store writes per second.

    .venv/bin/python benchmarks/rollout.py [--domains-per-family 6] [--tasks 3] [--workers 2]

Every family runs its domains' oracles through the full path (environment, sandbox from a warm
pool, verifier, store) with 2 workers, twice in a row: `fresh` (`SandboxPool(reuse=False)`: a
new sandbox per episode, booted in the background, and grading mode "fresh": a new grading
sandbox per grade) and `reset` (`SandboxPool(reuse=True)`, the default: one sandbox per worker,
reset to pristine between episodes, and grading sandboxes from the reset pool keyed by
configuration, `posttrain.verifiers.grading`). Each pool preloads what the family's domains
declare and is warm (`size` sandboxes booted) before the clock starts; so are the grading
sandboxes: one untimed episode per domain runs first in both modes (the reset mode's grading
pool then holds a sandbox of each configuration the graders ask for).
Families without sandboxed domains run the same path in both modes (a ratio near 1). Episodes
are run `workers` at a time: `run_episodes` starts every episode it is given at once, each
holding a sandbox (issue 13, "unbounded sandboxes"), so handing it all of them would measure
boots in both modes. Prints a table, then one JSON line.

Store growth of image episodes (`--images-only` runs just this): GRPO-like groups (`--group`
samples of each task) of image domains (a chart, statement pages, a drawing with the render
tool) written to a fresh store; the store file's growth per episode (after a WAL checkpoint),
beside what it would be if every image reference were stored as its own copy.
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

from posttrain.envs import EnvConfig, sandbox_preload
from posttrain.policies.scripted import ScriptedPolicy
from posttrain.sandbox import SandboxPool
from posttrain.scheduling.engine import WorkItem, run_episodes
from posttrain.storage.store import Store
from posttrain.tasks.registry import families, get_domain
from posttrain.verifiers import grading

IMAGE_DOMAINS = ("docs.chart.peak.bar", "docs.page.cash-reconciliation", "geometry.drawing.cylinder.dims")


def _store_bytes(path: Path) -> int:
    import sqlite3

    with sqlite3.connect(path) as db:  # fold the WAL into the file before measuring it
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return path.stat().st_size


def image_store_growth(tmp: str, group: int, tasks: int, workers: int) -> dict:
    """Store bytes per image episode, and images stored vs referenced (see the module docstring)."""
    domains = [get_domain(n) for n in IMAGE_DOMAINS]
    # one id per episode: the store keeps one trajectory per (run, group, member, attempt)
    specs = [WorkItem(d, d.task(seed), group_id=f"{d.name}:{seed}:{k}")
             for d in domains for seed in range(tasks) for k in range(group)]
    path = Path(tmp) / "images.sqlite"
    store = Store(path)
    empty = _store_bytes(path)
    with SandboxPool(size=workers, preload=sandbox_preload(domains)) as pool:
        done: list = []
        t0 = time.perf_counter()
        for i in range(0, len(specs), workers):  # `workers` at a time, as above (issue 13)
            run_episodes(specs[i:i + workers], ScriptedPolicy.oracle(), sandbox_factory=pool.sandbox,
                         workers=workers, on_result=lambda r: done.append((r.trajectory, r.task, r.workspace_archive)))
        wall = time.perf_counter() - t0
    for traj, task, ws in done:
        store.put_trajectory(traj, task, ws)
    stats = store.image_stats()
    store.close()
    grown = _store_bytes(path) - empty
    ref_bytes = sum(r["bytes"] for traj, _, _ in done for u in traj.turns for r in u.observation_images)
    out = {"episodes": len(done), "passed": sum(bool(t.passed) for t, _, _ in done),
           "image_refs": stats["refs"], "images_stored": stats["images"],
           "image_bytes_stored": stats["bytes"], "image_bytes_if_copied_per_ref": ref_bytes,
           "store_bytes_per_episode": round(grown / max(1, len(done))),
           "store_bytes_per_episode_if_copied": round((grown - stats["bytes"] + ref_bytes) / max(1, len(done))),
           "episodes_per_s": round(len(done) / wall, 2)}
    print(f"\nimage episodes: {out['episodes']} ({len(IMAGE_DOMAINS)} domains x {tasks} tasks x {group} "
          f"samples), passed {out['passed']}; {out['image_refs']} image references, {out['images_stored']} "
          f"images stored ({out['image_bytes_stored']} bytes; {ref_bytes} if each reference were a copy)")
    print(f"store growth per image episode: {out['store_bytes_per_episode']} bytes "
          f"({out['store_bytes_per_episode_if_copied']} if copied per reference); "
          f"{out['episodes_per_s']} episodes/s")
    return out


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
    ap.add_argument("--families", default="", help="comma-separated families (default: all)")
    ap.add_argument("--group", type=int, default=4, help="samples per image task (a GRPO group)")
    ap.add_argument("--images-only", action="store_true", help="only the image store-growth figure")
    args = ap.parse_args()
    if args.images_only:
        with tempfile.TemporaryDirectory() as tmp:
            print(json.dumps({"image_store": image_store_growth(tmp, args.group, args.tasks, args.workers)}))
        return
    known = families()
    wanted = [f for f in args.families.split(",") if f] or sorted(known)
    if unknown := [f for f in wanted if f not in known]:
        ap.error(f"--families: unknown {unknown} (known: {', '.join(sorted(known))})")

    rows, per_turn_overheads = [], []
    store_writes, store_s = 0, 0.0
    load_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "store.sqlite")
        for family in wanted:
            domains = known[family]
            chosen = spread(sorted(domains, key=lambda d: d.name), args.domains_per_family)
            specs = [WorkItem(d, d.task(seed)) for d in chosen for seed in range(args.tasks)]
            rates = {}
            warmup = [WorkItem(d, d.task(0)) for d in chosen]
            for mode in ("fresh", "reset"):
                grading.set_grading_mode(mode)
                with SandboxPool(size=args.workers, preload=sandbox_preload(chosen),
                                 reuse=mode == "reset") as pool:
                    for i in range(0, len(warmup), args.workers):
                        run_episodes(warmup[i:i + args.workers], ScriptedPolicy.oracle(),
                                     env_config=EnvConfig(), sandbox_factory=pool.sandbox,
                                     workers=args.workers)
                    pool.wait_ready()
                    graders0 = dict(grading.grading_pool().stats) if mode == "reset" else {}
                    done, trajs = [], []
                    t0 = time.perf_counter()
                    for i in range(0, len(specs), args.workers):
                        trajs += run_episodes(specs[i:i + args.workers], ScriptedPolicy.oracle(),
                                              env_config=EnvConfig(), sandbox_factory=pool.sandbox,
                                              workers=args.workers,
                                              on_result=lambda r, done=done: done.append(
                                                  (r.trajectory, r.task, r.workspace_archive)))
                    wall = time.perf_counter() - t0
                    stats = dict(pool.stats)
                    if mode == "reset":  # grading sandboxes booted and reused while timed
                        g = grading.grading_pool().stats
                        stats["grader_boots"] = g["booted"] - graders0.get("booted", 0)
                        stats["grader_reuses"] = g["reused"] - graders0.get("reused", 0)
                        stats["discards"] += g["discards"] - graders0.get("discards", 0)
                    rates[mode] = (len(trajs) / wall, stats)
                grading.close_grading_pool()
            grading.set_grading_mode(None)
            # from here on, `trajs` and `done` are the reset run's (the default mode)
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
            fresh, (reset, stats) = rates["fresh"][0], rates["reset"]
            rows.append({"family": family, "domains": len(chosen), "episodes": len(trajs), "turns": turns,
                         "passed": passed, "infra_error": infra, "wall_s": round(wall, 3),
                         "episodes_per_s": round(reset, 2), "eps_per_s_fresh": round(fresh, 2),
                         "eps_per_s_reset": round(reset, 2), "reset_vs_fresh": round(reset / fresh, 2),
                         "resets": stats["resets"], "discards": stats["discards"],
                         "boots": stats["booted"], "grader_boots": stats["grader_boots"],
                         "grader_reuses": stats["grader_reuses"]})
        store.close()
        images = image_store_growth(tmp, args.group, args.tasks, args.workers)

    # Pure runner overhead: single-answer episodes with an exact-match verifier, no sandbox.
    math_domains = sorted(families()["math"], key=lambda d: d.name)[:4]
    specs = [WorkItem(d, d.task(s)) for d in math_domains for s in range(250)]
    t0 = time.perf_counter()
    trajs = run_episodes(specs, ScriptedPolicy.oracle(), workers=1)
    runner_us = (time.perf_counter() - t0) / sum(len(t.turns) for t in trajs) * 1e6

    print(f"{'family':10} {'domains':>7} {'episodes':>8} {'turns':>6} {'passed':>6} {'infra':>5} "
          f"{'eps/s fresh':>11} {'eps/s reset':>11} {'ratio':>6} {'resets':>6} {'discards':>8} {'boots':>5} "
          f"{'grader boots/reuses':>19}")
    for r in rows:
        print(f"{r['family']:10} {r['domains']:>7} {r['episodes']:>8} {r['turns']:>6} {r['passed']:>6} "
              f"{r['infra_error']:>5} {r['eps_per_s_fresh']:>11} {r['eps_per_s_reset']:>11} "
              f"{r['reset_vs_fresh']:>6} {r['resets']:>6} {r['discards']:>8} {r['boots']:>5} "
              f"{str(r['grader_boots']) + '/' + str(r['grader_reuses']):>19}")
    overhead_ms = statistics.median(per_turn_overheads) * 1e3
    writes_per_s = store_writes / store_s
    print(f"\nsandboxed episode overhead per turn (total - tool - verify - generation), median: "
          f"{overhead_ms:.2f} ms (includes taking a sandbox from the pool and archiving the workspace)")
    print(f"runner overhead per turn, single-answer episodes without sandbox: {runner_us:.0f} us")
    print(f"store writes: {writes_per_s:.0f} trajectories/s ({store_writes} written)")
    load_end = os.getloadavg()[0]
    print(f"load average (1 min): {load_start:.2f} at the start, {load_end:.2f} at the end, "
          f"on {os.cpu_count()} cores")
    print(json.dumps({
        "episodes_per_s": {r["family"]: r["episodes_per_s"] for r in rows},
        "eps_per_s_fresh": {r["family"]: r["eps_per_s_fresh"] for r in rows},
        "eps_per_s_reset": {r["family"]: r["eps_per_s_reset"] for r in rows},
        "reset_vs_fresh": {r["family"]: r["reset_vs_fresh"] for r in rows},
        "discards": sum(r["discards"] for r in rows),
        "grader_boots_reset": {r["family"]: r["grader_boots"] for r in rows},
        "load_avg_1m_start": round(load_start, 2), "load_avg_1m_end": round(load_end, 2),
        "oracle_pass_rate": round(sum(r["passed"] for r in rows) / max(1, sum(r["episodes"] for r in rows)), 4),
        "infra_errors": sum(r["infra_error"] for r in rows),
        "episode_overhead_ms_per_turn_p50": round(overhead_ms, 3),
        "runner_overhead_us_per_turn": round(runner_us, 1),
        "store_writes_per_s": round(writes_per_s, 1),
        "workers": args.workers,
        "image_store": images,
    }))
    sys.exit(0)


if __name__ == "__main__":
    main()
