"""Crash test: a short `posttrain run` killed with SIGKILL again and again, resumed each time.

    .venv/bin/python benchmarks/crash.py [--kills 12] [--steps 10] [--seed 0] [--dir runs/crash-bench]

First the job runs uninterrupted (`ref`). Then the same job (`crash`) is started and killed with
SIGKILL at `--kills` points drawn at random (seeded) from these kinds, each resume with `--resume`:

* `eval-before`, `eval-after`: inside a store transaction of an evaluation (a sample half-written);
* `store`: inside a store transaction of a training group (after the inserts, before COMMIT);
* `step`: between trainer steps, with the step's metrics line torn in half;
* `checkpoint`: mid-checkpoint (the weights written into `.step-N.tmp-*`, the rest not);
* `latest`: after the checkpoint directory is in place, before `latest.json` points at it.

A kill happens in a child process: this script re-runs itself with `--child KIND:N`, which wraps
the library function at that point so that its N-th call SIGKILLs the process (nothing in the
library knows about this), then runs the `posttrain run` command. When every kill is spent the
job runs to its end. Then the two runs are compared:

* `duplicates`: rows beyond one per identity (store tables, metrics lines per step, eval files);
* `lost`: identities in the uninterrupted run missing from the crashed one (trajectories by
  group/member/attempt, evaluation samples, metrics steps, the final checkpoint);
* `metrics_identical`: every step's rewards (overall, per domain, per family) and the final
  figures equal the uninterrupted run's;
* `leftovers`: live child processes, mounts under the run directory, temp dirs and files.

Targets: duplicates 0, lost 0, metrics_identical true, leftovers 0. Prints a table, then one
JSON line. A tiny job (two domains, 4 groups x 4 samples per step), so it runs in a few minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CONFIG = """
name = "{name}"
runs_dir = "{runs}"
steps = {steps}
checkpoint_every = 1
keep_checkpoints = 2
[domains]
train = ["math.add.d2", "text.reverse.l3"]
heldout = ["math.add.d1"]
[rollout]
group_size = 4
groups_per_step = 4
[eval]
tasks_per_domain = 4
samples = 2
[trainer]
lr = 1e-4
"""

KINDS = ("eval-before", "store", "step", "checkpoint", "latest", "eval-after")
TRAINING_KINDS = ("store", "step", "checkpoint", "latest")


# -- the child: one `posttrain run` that dies at a chosen point ---------------------------------
def _die_on_call(owner: object, name: str, n: int, *, before: bool, when=lambda *a, **k: True) -> None:
    """Wrap `owner.name` so that its n-th call (among those `when` accepts) SIGKILLs the process,
    before or after the real call."""
    real = getattr(owner, name)
    calls = {"n": 0}

    def wrapper(*args, **kwargs):
        hit = when(*args, **kwargs) and (calls.__setitem__("n", calls["n"] + 1) or calls["n"] == n)
        if hit and before:
            os.kill(os.getpid(), signal.SIGKILL)
        out = real(*args, **kwargs)
        if hit:
            os.kill(os.getpid(), signal.SIGKILL)
        return out

    setattr(owner, name, wrapper)


def child(point: str, argv: list[str]) -> None:
    from posttrain.pipeline import metrics
    from posttrain.storage.store import Store
    from posttrain.training import checkpoints, resume

    kind, n = point.split(":")
    n = int(n)
    if kind in ("eval-before", "eval-after", "store"):
        # inside the transaction of the n-th write of an eval sample (or a training group): the
        # rows are inserted, COMMIT never comes
        real_put, real_tx = Store.put_trajectories, Store._tx
        calls = {"n": 0, "armed": False}

        def put(self, items):
            run_id = items[0][0].run_id if items else ""
            if run_id == {"eval-before": "eval:before", "eval-after": "eval:after"}.get(kind, run_id) \
                    and run_id.startswith("eval:") == kind.startswith("eval"):
                calls["n"] += 1
                calls["armed"] = calls["n"] == n
            return real_put(self, items)

        def tx(self, fn, *args):
            if not calls["armed"]:
                return real_tx(self, fn, *args)

            def dying(cursor, *a):
                fn(cursor, *a)
                os.kill(os.getpid(), signal.SIGKILL)

            return real_tx(self, dying, *args)

        Store.put_trajectories, Store._tx = put, tx
    elif kind == "step":
        real_write = metrics.MetricsLog.write
        calls = {"n": 0}

        def write(self, row):
            calls["n"] += 1
            if calls["n"] == n:  # half a line on disk, then death
                text = json.dumps(row, default=str)
                with open(self.path, "a", encoding="utf-8") as f:
                    f.write(text[: len(text) // 2])
                os.kill(os.getpid(), signal.SIGKILL)
            return real_write(self, row)

        metrics.MetricsLog.write = write
    elif kind == "checkpoint":
        # the weights are in the temporary directory; optimizer, RNG and state are not
        _die_on_call(checkpoints, "save_state", n, before=True)
    elif kind == "latest":
        # step-N is in place, latest.json still points at the previous checkpoint
        _die_on_call(resume.RunCheckpoints, "prune", n, before=True)
    else:
        raise SystemExit(f"--child: unknown kill point {point!r} (kinds: {', '.join(KINDS)})")
    from posttrain.cli import app

    app(argv, prog_name="posttrain")


# -- the parent: plan, run, compare --------------------------------------------------------------
def _run(args: list[str], point: str | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    cmd = ([sys.executable, __file__, "--child", point, "--"] if point else
           [sys.executable, "-m", "posttrain.cli"]) + ["run", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=timeout)


def _plan(rng: random.Random, kills: int) -> list[str]:
    """`kills` kill points: two in the first evaluation, two in the last, the rest in training
    (every training kind at least once while there are enough), each numbered so that a resumed
    process gets a little further before it dies (or not at all: that is a kill too)."""
    n_train = max(0, kills - 4)
    kinds = [TRAINING_KINDS[i % len(TRAINING_KINDS)] for i in range(n_train)]
    rng.shuffle(kinds)
    span = {"store": (1, 4), "step": (2, 3), "checkpoint": (1, 2), "latest": (1, 2)}
    return ([f"eval-before:{rng.randint(1, 24)}" for _ in range(min(2, kills))]
            + [f"{k}:{rng.randint(*span[k])}" for k in kinds]
            + [f"eval-after:{rng.randint(1, 24)}" for _ in range(min(2, max(0, kills - 2)))])


def _identities(run_dir: Path, run: str) -> dict[str, set]:
    from posttrain.storage.store import Store

    with Store.for_run_dir(run_dir, readonly=True) as store:
        db = store._db
        train = {tuple(r) for r in db.execute(
            "SELECT group_id, member, attempt FROM trajectories WHERE run_id=?", (run,))}
        evals = {tuple(r) for r in db.execute(
            "SELECT run_id, group_id, member, attempt FROM trajectories WHERE run_id LIKE 'eval:%'")}
        dup = store.duplicates()
        integrity = store.check()
    return {"train": train, "eval": evals, "dup": dup, "integrity": integrity}


def _metrics(run_dir: Path) -> list[dict]:
    rows = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        rows.append({k: v for k, v in row.items() if k == "step" or k.endswith("/reward")
                     or k.endswith("/pass_rate") or k == "reward_mean"})
    return rows


FINAL_KEYS = ("base_pass1", "base_pass2", "final_pass1", "final_pass2", "heldout_base_pass1",
              "heldout_final_pass1")


def _leftovers(base: Path, run_dir: Path) -> dict[str, list[str]]:
    procs, ours, pid = [], set(), os.getpid()
    while pid > 1:  # this script and whatever started it name the directory too
        ours.add(pid)
        pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    for proc in Path("/proc").iterdir():  # anything still working on this benchmark's job
        if proc.name.isdigit() and int(proc.name) not in ours:
            try:
                if str(base) in (proc / "cmdline").read_text(errors="replace").replace("\0", " "):
                    procs.append(proc.name)
            except OSError:
                continue
    mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()
              if str(run_dir) in line]
    temps = [str(p.relative_to(run_dir)) for p in run_dir.rglob("*")
             if ".tmp" in p.name or ".old-" in p.name]
    return {"processes": sorted(set(procs)), "mounts": mounts, "temp": temps}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kills", type=int, default=12, help="SIGKILLs (>= 10 for the issue's target)")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--seed", type=int, default=0, help="draws the kill points")
    ap.add_argument("--dir", default="runs/crash-bench", help="where both runs go (replaced)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args, rest = ap.parse_known_args()
    if args.child:
        return child(args.child, [a for a in rest if a != "--"])

    base = (ROOT / args.dir).resolve()
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    cfg = base / "job.toml"
    cfg.write_text(CONFIG.format(name="ref", runs=base / "runs", steps=args.steps))
    t0 = time.perf_counter()
    ref = _run([str(cfg), "--json"])
    if ref.returncode != 0:
        raise SystemExit(f"the uninterrupted run failed:\n{ref.stderr[-3000:]}")
    ref_s = time.perf_counter() - t0

    rng = random.Random(args.seed)
    plan = _plan(rng, args.kills)
    crash_cfg = ["--name", "crash"]
    outcomes = []
    started = False
    t1 = time.perf_counter()
    for point in plan + [None]:
        p = _run([str(cfg), *crash_cfg, "--json"] + (["--resume"] if started else []), point)
        killed = p.returncode == -signal.SIGKILL
        started = started or (base / "runs" / "crash" / "store.sqlite").exists()
        outcomes.append({"point": point or "(to the end)", "rc": p.returncode, "killed": killed,
                         "ok": killed or p.returncode == 0,
                         "error": "" if killed or p.returncode == 0 else p.stderr.strip()[-400:]})
        if point is None or p.returncode == 0:
            break
    crash_s = time.perf_counter() - t1

    ref_dir, crash_dir = base / "runs" / "ref", base / "runs" / "crash"
    a, b = _identities(ref_dir, "ref"), _identities(crash_dir, "crash")
    ma, mb = _metrics(ref_dir), _metrics(crash_dir)
    steps_b = [r["step"] for r in mb]
    duplicates = (sum(b["dup"].values()) + len(steps_b) - len(set(steps_b))
                  + len(list((crash_dir / "evals").glob("*.json"))) - len(list((ref_dir / "evals").glob("*.json"))))
    lost = (len(a["train"] - b["train"]) + len(a["eval"] - b["eval"])
            + len({r["step"] for r in ma} - set(steps_b)))
    latest = json.loads((crash_dir / "checkpoints" / "latest.json").read_text()) \
        if (crash_dir / "checkpoints" / "latest.json").exists() else {}
    lost += int(latest.get("step") != args.steps)
    summary_a = json.loads((ref_dir / "summary.json").read_text())
    summary_b = json.loads((crash_dir / "summary.json").read_text()) if (crash_dir / "summary.json").exists() else {}
    finals_equal = all(summary_a.get(k) == summary_b.get(k) for k in FINAL_KEYS)
    metrics_identical = ma == mb and finals_equal
    left = _leftovers(base, crash_dir)
    kills = sum(o["killed"] for o in outcomes)
    result = {
        "kills": kills, "resumed_ok": sum(o["ok"] for o in outcomes[1:]),
        "resumes": len(outcomes) - 1, "duplicates": duplicates, "lost": lost,
        "metrics_identical": metrics_identical,
        "leftovers": sum(len(v) for v in left.values()),
        "store_integrity_ok": not b["integrity"],
        "kinds": sorted({o["point"].split(":")[0] for o in outcomes if o["killed"]}),
        "steps": args.steps, "ref_s": round(ref_s, 1), "crashed_s": round(crash_s, 1),
    }

    print(f"{'#':>3}  {'kill point':<18}{'outcome':<12}")
    for i, o in enumerate(outcomes):
        outcome = "killed" if o["killed"] else "finished" if o["rc"] == 0 else f"rc={o['rc']}"
        print(f"{i:>3}  {o['point']:<18}{outcome:<12}{o['error'][:100]}")
    print()
    print(f"{'':28}{'uninterrupted':>14}{'crashed':>14}")
    print(f"{'training trajectories':28}{len(a['train']):>14}{len(b['train']):>14}")
    print(f"{'evaluation samples':28}{len(a['eval']):>14}{len(b['eval']):>14}")
    print(f"{'metrics lines':28}{len(ma):>14}{len(mb):>14}")
    for k in FINAL_KEYS:
        print(f"{k:28}{summary_a.get(k)!s:>14}{summary_b.get(k)!s:>14}")
    if not metrics_identical:
        diff = [(x["step"], x.get("reward_mean"), y.get("reward_mean")) for x, y in zip(ma, mb) if x != y]
        print(f"differing steps (step, ref, crashed): {diff[:10]}")
    if result["leftovers"]:
        print(f"leftovers: {left}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
