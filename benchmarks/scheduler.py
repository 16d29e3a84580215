"""Scheduler benchmark: posttrain's async scheduler vs a synchronous-batch baseline, no model.

    .venv/bin/python benchmarks/scheduler.py            # ~1.5 min on 2 busy cores

One simulated workload: 300 domains whose environment-step medians are log-uniform over three
orders of magnitude (1 ms .. 1 s), each step lognormal around its median, 1-4 turns, 16-256
tokens per turn, 5% of episodes failing with an injected infrastructure error (half raised, half
returned as infra_error), and a generator of fixed throughput (tokens/s plus a per-call cost).
Sleeps are real and scaled by TIME_SCALE (0.2: a 1 s step sleeps 0.2 s), so the run exercises the
real code path (event loop, thread pool, batcher) in about a minute.

* posttrain: `Scheduler` (continuous batching, fair share of samples over 300 domains weighted
  1-4, a 6 s starvation guard, retries, staleness bound 4) feeding an instant trainer that takes
  `groups_per_step` groups per version. The lightest domains' fair-share period (sum of weights
  over their weight, in groups) is longer than this run: the guard is what bounds their wait.
* sync: the same groups (same task seeds, same episode seeds, so the same failures) run the
  classic way: a batch of `groups_per_step` groups, one `generate` call per turn over every active
  episode (in `max_batch` chunks), every environment step in the same-size thread pool, wait for
  the slowest, repeat; failed members re-run (attempt + 1) within their batch.

Also measured: the core's cost per decision with 1,000 domains (cost-mode fair share, caps and
concurrency limits, a fake clock), its quota accuracy there over many groups, and the dispatch
cost of a thread pool vs a process pool (why the local backend uses threads).

Also measured, core alone: each synchronous trainer step's composition over 402 domains shaped
like the registry's families (`--mix-only`: just that, in seconds).

Prints a table, then one JSON line.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import sys
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

from posttrain.scheduling import (
    AdaptiveConfig,
    BatchConfig,
    DomainSpec,
    RetryConfig,
    Scheduler,
    SchedulerConfig,
    SchedulerCore,
)
from posttrain.scheduling.backends import advance_episode, start_episode
from posttrain.scheduling.sim import SimFactory, SimGenerator, make_domains
from posttrain.scheduling.work import EpisodeSpec, Usage, derive_seed, mix_seed

N_DOMAINS = 300
TIME_SCALE = 0.2
GROUP_SIZE = 4
GROUPS = 480
GROUPS_PER_STEP = 32
WORKERS = 128
TOKENS_PER_S = 40_000.0
CALL_S = 0.002
SEED = 7
STARVATION_S = 6.0


def workload():
    domains = make_domains(N_DOMAINS, seed=SEED, step_range=(0.001, 1.0), sigma=0.5, failure_rate=0.05,
                           turns=(1, 4), tokens=(16, 256))
    rng = random.Random(SEED)
    specs = [DomainSpec(d.name, weight=float(rng.randint(1, 4))) for d in domains]
    config = SchedulerConfig(
        group_size=GROUP_SIZE, tiers=("train",), trainer_tier="train",
        max_running=GROUPS_PER_STEP * 5 * GROUP_SIZE,
        groups_per_step=GROUPS_PER_STEP, max_staleness=4, max_groups=GROUPS, share_by="samples",
        window_s=3600.0, starvation_s=STARVATION_S, seed=SEED,
        retry=RetryConfig(max_retries=3, backoff_s=0.01, backoff_max_s=0.1),
        adaptive=AdaptiveConfig(enabled=False), batch=BatchConfig(max_batch=64, max_wait_s=0.002))
    return domains, specs, config


def generator() -> SimGenerator:
    return SimGenerator(tokens_per_s=TOKENS_PER_S, call_s=CALL_S, time_scale=1.0)


# -- posttrain ----------------------------------------------------------------------------
async def run_posttrain(domains, specs, config):
    sched = Scheduler(config, specs, generator(), factory=SimFactory(domains, TIME_SCALE), workers=WORKERS)
    groups = []
    last_admit = [None]

    async def watch():  # when the last group of the workload is admitted (the drain begins)
        while sched.core.admitted_trainer < GROUPS:
            await asyncio.sleep(0.005)
        last_admit[0] = time.perf_counter()

    t0 = time.perf_counter()
    async with sched:
        watcher = asyncio.create_task(watch())
        version = 0
        while True:
            batch = await sched.take(GROUPS_PER_STEP)
            if not batch:
                break
            groups += batch
            version += 1
            sched.set_policy_version(f"v{version}")
        wall = time.perf_counter() - t0
        await watcher
        metrics = sched.metrics()
    # steady state: from the first generate call to the last admission; before it the first
    # episodes are starting, after it a finite workload drains (an endless run never does)
    first_call = sched.batcher.intervals[0][0]
    metrics["generator_busy_steady"] = sched.batcher.busy_between(first_call, last_admit[0])
    metrics["ramp_s"], metrics["drain_s"] = first_call - t0, t0 + wall - last_admit[0]
    admitted = [(d, i) for d, ds in sched.core.dom.items() for i in range(ds.next_index)]
    return wall, groups, metrics, admitted


# -- the synchronous baseline -------------------------------------------------------------
def run_sync(domains, config, admitted):
    factory, gen = SimFactory(domains, TIME_SCALE), generator()
    order = sorted(admitted, key=lambda x: (x[1], x[0]))
    kept = failed = dropped_groups = 0
    gen_s = 0.0
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        for b in range(0, len(order), GROUPS_PER_STEP):
            batch = order[b:b + GROUPS_PER_STEP]
            # members: (domain, index, member) -> attempt
            todo = [(d, i, m, 0) for d, i in batch for m in range(GROUP_SIZE)]
            dead_groups: set[tuple[str, int]] = set()
            while todo:
                specs = [_spec(config, d, i, m, a) for d, i, m, a in todo]
                started = list(pool.map(lambda s: _safe_start(factory, s), specs))
                active = {k: (st[0], st[1]) for k, st in enumerate(started) if st[1] is not None}
                results = {k: st[2] for k, st in enumerate(started) if st[1] is None}
                while active:
                    keys = list(active)
                    completions = []
                    for c in range(0, len(keys), config.batch.max_batch):
                        chunk = [active[k][1] for k in keys[c:c + config.batch.max_batch]]
                        t = time.perf_counter()
                        completions += gen.generate(chunk)
                        gen_s += time.perf_counter() - t
                    steps = list(pool.map(lambda kc, active=active: _safe_advance(active[kc[0]][0], kc[1]),
                                          zip(keys, completions)))
                    for k, (req, traj) in zip(keys, steps):
                        if req is None:
                            results[k] = traj
                            del active[k]
                        else:
                            active[k] = (active[k][0], req)
                retry = []
                for k, (d, i, m, a) in enumerate(todo):
                    traj = results[k]
                    if traj is not None and traj.trajectory.status != "infra_error":
                        kept += 1
                    else:
                        failed += 1
                        if a < config.retry.max_retries:
                            retry.append((d, i, m, a + 1))
                        else:
                            dead_groups.add((d, i))
                todo = retry
            dropped_groups += len(dead_groups)
    wall = time.perf_counter() - t0
    return wall, {"kept": kept, "failed": failed, "dropped_groups": dropped_groups, "gen_s": gen_s}


def _safe_start(factory, spec):
    try:
        return start_episode(factory, spec)
    except Exception:  # noqa: BLE001 - an injected raise: the episode failed
        return None, None, None, 0.0


def _safe_advance(driver, completion):
    try:
        req, traj, _ = advance_episode(driver, completion)
        return req, traj
    except Exception:  # noqa: BLE001 - an injected raise: the episode failed
        return None, None


def _spec(config, domain, index, member, attempt) -> EpisodeSpec:
    gid = f"{domain}#{index}"
    return EpisodeSpec(group_id=gid, domain=domain, tier="train", split="train", member=member,
                       attempt=attempt, task_seed=derive_seed(config.seed, domain, index, "task"),
                       sampling_seed=mix_seed(derive_seed(config.seed, domain, index, "task"), member, attempt),
                       policy_version="v0", version=0)


# -- the core alone, 1,000 domains ----------------------------------------------------------
def core_overhead(n_domains=1000, groups=30_000):
    """Decisions of the core alone: 1,000 domains in cost mode, a tenth with share caps, a
    quarter with concurrency limits, adaptive weights on, 3% infra errors, completions out of
    order. Timed: next_episode + episode_finished + take_ready (trajectories are built before)."""
    from posttrain.values.episode import EpisodeResult
    from posttrain.values.trajectory import ErrorInfo, Trajectory
    rng = random.Random(1)
    now = [0.0]
    specs = [DomainSpec(f"d{i:04d}", weight=float(rng.randint(1, 4)),
                        max_concurrency=rng.choice([None, None, None, 8]),
                        max_cost_share=rng.choice([None] * 9 + [0.002])) for i in range(n_domains)]
    cost = {s.name: math.exp(rng.uniform(math.log(0.5), math.log(5.0))) for s in specs}
    cfg = SchedulerConfig(group_size=4, tiers=("train",), trainer_tier="train", max_running=256,
                          max_staleness=None, share_by="cost", window_s=1e9, starvation_s=3600.0,
                          adaptive=AdaptiveConfig(enabled=True, retire_after=None),
                          retry=RetryConfig(backoff_s=0.0, backoff_max_s=0.0))
    core = SchedulerCore(cfg, specs, clock=lambda: now[0])
    core.worker_slots = 1

    def make(status, reward=None):
        return EpisodeResult(Trajectory(task_key="k", task_hash="h", domain="d", split="train", policy_version="v",
                                        status=status, reward=reward,
                                        error=ErrorInfo("E", "x", where="env") if status == "infra_error" else None),
                             task=None)
    n_done = 40
    # 3% infra errors; members alternate pass/fail, so every group has signal and adaptive
    # sampling (on, and paid for) leaves the weights as configured
    failed = make("infra_error")
    kept = [make("completed", 0.0), make("completed", 1.0)]
    usages = {d: Usage(sandbox_s=c) for d, c in cost.items()}
    running: list = []
    warm: dict[str, float] | None = None  # cost per domain when the first fifth of groups is in
    picks = [rng.random() for _ in range(4096)]
    decisions = j = 0
    t_next = t_done = t_take = 0.0
    t0, cpu0 = time.perf_counter(), time.thread_time()
    clock = time.thread_time  # CPU time of this thread: other processes' load does not count
    while core.counters["groups_admitted"] < groups:
        a = clock()
        while (spec := core.next_episode()) is not None:
            running.append(spec)
            decisions += 1
        b = clock()
        for _ in range(n_done):  # completions arrive out of order: a random running one ends
            j = (j + 1) % len(picks)
            k = int(picks[j] * len(running))
            running[k], running[-1] = running[-1], running[k]
            spec = running.pop()
            now[0] += 0.001
            traj = failed if j % 33 == 0 else kept[spec.member % 2]
            core.episode_finished(spec, traj, usages[spec.domain])
        c = clock()
        core.take_ready("train")
        if warm is None and core.counters["groups_admitted"] >= groups // 2:
            warm = {d: ds.cost for d, ds in core.dom.items()}
        t_next += b - a
        t_done += c - b
        t_take += clock() - c
    elapsed, cpu = time.perf_counter() - t0, time.thread_time() - cpu0
    # Fair-share accuracy in cost mode over the uncapped, unlimited domains (limited and capped
    # ones take less than their share; the rest is shared by weight among these), after a warm-up
    # (the first half of the groups: every tag starts equal, so each domain's first group goes
    # at once whatever it costs). Fair queueing keeps each domain within about one group's cost
    # of its weighted share, so the gap is given in groups of that domain.
    assert warm is not None
    spent = {d: ds.cost - warm[d] for d, ds in core.dom.items()}
    free = {s.name: s.weight for s in specs if s.max_cost_share is None and s.max_concurrency is None}
    rest, wsum = sum(spent[n] for n in free), sum(free.values())
    gap_groups = [abs(spent[n] - rest * w / wsum) / (4 * cost[n]) for n, w in free.items()]
    share_gap = [abs(spent[n] / rest - w / wsum) for n, w in free.items()]
    return {"decisions": decisions, "us_per_episode": cpu / decisions * 1e6,
            "us_per_episode_wall": elapsed / decisions * 1e6,
            "us_next": t_next / decisions * 1e6, "us_finished": t_done / decisions * 1e6,
            "us_take": t_take / decisions * 1e6,
            "groups": core.counters["groups_admitted"],
            "quota_gap_groups_p50": sorted(gap_groups)[len(gap_groups) // 2],
            "quota_gap_groups_max": max(gap_groups), "quota_share_gap_max": max(share_gap)}


# -- per-step composition, registry-shaped mix ------------------------------------------------
MIX_FAMILIES = {"code": 41, "docs": 86, "geometry": 43, "math": 54, "rg": 95, "terminal": 41, "text": 42}


def step_mix(steps=40, family_weights=None):
    """Synchronous steps of `GROUPS_PER_STEP` groups over 402 domains shaped like the registry's
    families (names `family.sub.domain`), the core alone: per domain, the worst |share of a step
    - quota| averaged over domains (`step_mix_error`, as benchmarks/breadth.py), and per step the
    worst |family share - family quota| (max and mean over steps) and the fewest families."""
    from collections import Counter

    from posttrain.values.episode import EpisodeResult
    from posttrain.values.trajectory import Trajectory
    fw = family_weights or {}
    specs = [DomainSpec(f"{f}.s{i % 5}.d{i:03d}", weight=fw.get(f, 1.0))
             for f, n in MIX_FAMILIES.items() for i in range(n)]
    cfg = SchedulerConfig(group_size=2, tiers=("train",), trainer_tier="train", max_running=10**6,
                          groups_per_step=GROUPS_PER_STEP, max_staleness=0, seed=SEED,
                          adaptive=AdaptiveConfig(enabled=False))
    now = [0.0]
    core = SchedulerCore(cfg, specs, clock=lambda: now[0])
    rng = random.Random(SEED)
    comps = []
    for step in range(steps):
        running = []
        while (spec := core.next_episode()) is not None:
            running.append(spec)
        rng.shuffle(running)
        for spec in running:
            now[0] += 0.01
            traj = Trajectory(task_key="k", task_hash="h", domain=spec.domain, split="train",
                              policy_version="v", status="completed", reward=float(spec.member % 2))
            core.episode_finished(spec, EpisodeResult(traj, None), Usage())
        comps.append(Counter(g.domain for g in core.take(GROUPS_PER_STEP) or []))
        core.set_version(f"step-{step + 1}")
    total = sum(s.weight for s in specs)
    quota = {s.name: s.weight / total for s in specs}
    fquota: Counter = Counter()
    for d, q in quota.items():
        fquota[d.split(".")[0]] += q
    fam_err, fam_min = [], len(fquota)
    for c in comps:
        fam: Counter = Counter()
        for d, k in c.items():
            fam[d.split(".")[0]] += k
        fam_err.append(max(abs(fam[f] / GROUPS_PER_STEP - q) for f, q in fquota.items()))
        fam_min = min(fam_min, len(fam))
    dom = sum(max(abs(c[d] / GROUPS_PER_STEP - q) for c in comps) for d, q in quota.items()) / len(quota)
    return {"step_mix_error": dom, "step_family_error_max": max(fam_err),
            "step_family_error_mean": sum(fam_err) / len(fam_err), "step_families_min": fam_min}


# -- thread vs process dispatch ---------------------------------------------------------------
def _noop(x):
    return x


def _cpu(n):
    s = 0
    for i in range(n):
        s += i * i
    return s


def pool_dispatch():
    out = {}
    for name, cls in (("thread", ThreadPoolExecutor), ("process", ProcessPoolExecutor)):
        with cls(max_workers=2) as pool:
            list(pool.map(_noop, range(50)))  # warm up
            t = time.perf_counter()
            for i in range(300):
                pool.submit(_noop, i).result()
            out[f"{name}_roundtrip_us"] = (time.perf_counter() - t) / 300 * 1e6
            t = time.perf_counter()
            list(pool.map(_cpu, [20_000] * 200))
            out[f"{name}_cpu_tasks_per_s"] = 200 / (time.perf_counter() - t)
    return out


def main() -> None:
    mixes = {"equal": step_mix(), "by_family": step_mix(family_weights={"code": 2.0, "terminal": 3.0,
                                                                       "math": 0.5})}
    print(f"per-step mix, {sum(MIX_FAMILIES.values())} domains in {len(MIX_FAMILIES)} families, "
          f"{GROUPS_PER_STEP} groups per step, 40 synchronous steps:")
    for name, mix in mixes.items():
        print(f"  weights {name:10} step_mix_error {mix['step_mix_error']:.4f}, family share vs quota "
              f"max {mix['step_family_error_max']:.3f} mean {mix['step_family_error_mean']:.3f}, "
              f"fewest families in a step {mix['step_families_min']}")
    if "--mix-only" in sys.argv:
        return
    domains, specs, config = workload()
    wall_a, groups, m, admitted = asyncio.run(run_posttrain(domains, specs, config))
    wall_s, sync = run_sync(domains, config, admitted)
    # quota: each domain's share of delivered samples vs its weight share
    weights = {s.name: s.weight for s in specs}
    wsum = sum(weights.values())
    samples = {n: 0 for n in weights}
    for g in groups:
        samples[g.domain] += len(g.trajectories)
    total = sum(samples.values())
    gaps = {n: abs(samples[n] / total - w / wsum) for n, w in weights.items()}
    gap_groups = max(abs(samples[n] - total * w / wsum) / GROUP_SIZE for n, w in weights.items())
    core = core_overhead()
    pools = pool_dispatch()
    c = m["counters"]
    sync_busy = sync["gen_s"] / wall_s
    rows = [
        ("wall time (s)", f"{wall_a:.2f}", f"{wall_s:.2f}"),
        ("generator busy, steady state", f"{m['generator_busy_steady']:.3f}", f"{sync_busy:.3f}"),
        ("generator busy, whole run", f"{m['generator_busy']:.3f}", f"{sync_busy:.3f}"),
        ("ramp-up / drain (s)", f"{m['ramp_s']:.2f} / {m['drain_s']:.2f}", "-"),
        ("worker utilisation", f"{m['worker_utilization']:.3f}", "-"),
        ("groups delivered", str(len(groups)), str(len(admitted) - sync["dropped_groups"])),
        ("episodes kept / infra_error", f"{c['episodes_kept']} / {c['episodes_infra_error']}",
         f"{sync['kept']} / {sync['failed']}"),
        ("mean generate batch", f"{m['batcher']['mean_batch']}", "-"),
        ("queue wait p50 / p99 (s)", f"{m['queue_wait_p50_s']} / {m['queue_wait_p99_s']}", "-"),
        (f"max wait between services (s; guard {STARVATION_S:.0f} s)", f"{m['max_wait_s']:.2f}", "-"),
        ("staleness max / mean", f"{m['staleness']['max']} / {m['staleness']['mean']}", "0 / 0"),
    ]
    print(f"workload: {N_DOMAINS} domains, {GROUPS} groups x {GROUP_SIZE}, steps 1 ms..1 s x {TIME_SCALE} "
          f"(real sleeps), 5% infra failures, generator {TOKENS_PER_S:.0f} tok/s "
          f"+ {CALL_S * 1e3:.0f} ms/call")
    print(f"{'':34}{'posttrain':>22}{'sync baseline':>18}")
    for name, a, b in rows:
        print(f"{name:34}{a:>22}{b:>18}")
    print(f"speedup vs sync: {wall_s / wall_a:.2f}x")
    print(f"quota (share of samples vs weight share, {N_DOMAINS} domains): max abs gap "
          f"{max(gaps.values()):.5f}, max gap {gap_groups:.2f} groups of the domain "
          f"(about {total / N_DOMAINS / GROUP_SIZE:.1f} groups per domain in this run)")
    print(f"core, 1,000 domains (cost mode, caps, limits, adaptive), CPU per launched episode: "
          f"decision {core['us_next']:.1f} us + result accounting {core['us_finished']:.1f} us + hand-over "
          f"{core['us_take']:.1f} us = {core['us_per_episode']:.1f} us "
          f"({core['us_per_episode_wall']:.1f} us wall) over {core['decisions']} episodes, "
          f"{core['groups']} groups; cost share vs weight share: max abs gap "
          f"{core['quota_share_gap_max']:.5f}, gap in groups of the domain p50 "
          f"{core['quota_gap_groups_p50']:.2f} "
          f"max {core['quota_gap_groups_max']:.2f}")
    print(f"dispatch round trip: thread {pools['thread_roundtrip_us']:.0f} us, process "
          f"{pools['process_roundtrip_us']:.0f} us; CPU-bound tasks/s (2 workers): thread "
          f"{pools['thread_cpu_tasks_per_s']:.0f}, process {pools['process_cpu_tasks_per_s']:.0f}")
    result = {
        "generator_busy": round(m["generator_busy_steady"], 4),
        "generator_busy_whole_run": round(m["generator_busy"], 4),
        "sync_generator_busy": round(sync_busy, 4),
        "speedup_vs_sync": round(wall_s / wall_a, 3),
        "overhead_us_per_decision": round(core["us_next"], 2),
        "overhead_us_per_result": round(core["us_finished"], 2),
        "overhead_us_per_episode_total": round(core["us_per_episode"], 2),
        "max_quota_error": round(max(gaps.values()), 6),
        "max_quota_gap_groups": round(gap_groups, 3),
        "core_quota_gap_groups_max": round(core["quota_gap_groups_max"], 3),
        "core_quota_share_gap_max": round(core["quota_share_gap_max"], 6),
        "max_wait_s": round(m["max_wait_s"], 3),
        "lost": m["lost"],
        "worker_utilization": round(m["worker_utilization"], 4),
        "posttrain_wall_s": round(wall_a, 3), "sync_wall_s": round(wall_s, 3),
        "retries": m["retries"], "infra_errors": m["infra_errors"],
        "groups_dropped": c["groups_dropped"], "staleness_max": m["staleness"]["max"],
        "thread_roundtrip_us": round(pools["thread_roundtrip_us"], 1),
        "process_roundtrip_us": round(pools["process_roundtrip_us"], 1),
        "time_scale": TIME_SCALE, "clock": "real (scaled sleeps)",
        "step_mix_error": round(mixes["equal"]["step_mix_error"], 4),
        "step_family_error_max": round(mixes["equal"]["step_family_error_max"], 4),
        "step_family_error_max_by_family_weights": round(mixes["by_family"]["step_family_error_max"], 4),
        "step_families_min": mixes["equal"]["step_families_min"],
    }
    print(json.dumps(result))


if __name__ == "__main__":
    sys.exit(main())
