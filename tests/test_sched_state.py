"""Scheduler state: JSON-able, restorable; a run killed and resumed loses and duplicates nothing."""

import asyncio
import json

import pytest

from posttrain.scheduling import (
    AdaptiveConfig,
    BatchConfig,
    DomainSpec,
    RetryConfig,
    Scheduler,
    SchedulerConfig,
    SchedulerCore,
    Usage,
)
from posttrain.scheduling.sim import SimFactory, SimGenerator, make_domains
from tests.test_sched_core import Clock, fail, launch_all, ok

GROUPS = 40


def config() -> SchedulerConfig:
    return SchedulerConfig(group_size=3, max_running=24, groups_per_step=4, max_staleness=2,
                           max_groups=GROUPS, tiers=("train",), seed=11,
                           adaptive=AdaptiveConfig(enabled=False),
                           retry=RetryConfig(max_retries=5, backoff_s=0.005, backoff_max_s=0.02),
                           batch=BatchConfig(max_batch=16, max_wait_s=0.002))


def test_killed_and_resumed_run_loses_and_duplicates_nothing():
    domains = make_domains(6, seed=5, step_range=(0.002, 0.03), failure_rate=0.1, turns=(1, 3))
    specs = [DomainSpec(d.name, weight=1.0 + i % 3) for i, d in enumerate(domains)]
    store: dict[str, list] = {}  # the run store: group id -> trajectories, written whole

    def put(group):
        assert group.group_id not in store, f"{group.group_id} completed twice"
        store[group.group_id] = group.trajectories

    async def first_run():
        sched = Scheduler(config(), specs, SimGenerator(1e6, call_s=0.001), factory=SimFactory(domains),
                          workers=12, on_group=put)
        async with sched:
            taken, version = 0, 0
            while taken < 16:
                taken += len(await sched.take(4))
                version += 1
                sched.set_policy_version(f"v{version}")
            state = sched.state_dict()
            await asyncio.sleep(0.05)  # more groups finish (and are stored) after the save
            in_flight = sched.metrics()["running_episodes"]
        return json.loads(json.dumps(state)), in_flight, sched.metrics()

    state, in_flight, m1 = asyncio.run(first_run())
    assert in_flight > 0  # the kill really cut episodes off
    assert m1["counters"]["episodes_abandoned"] >= in_flight and m1["lost"] == 0
    stored_at_kill = set(store)
    open_at_save = {g["gid"] for g in state["groups"]}
    assert open_at_save and not open_at_save <= stored_at_kill  # some must be re-issued

    async def second_run():
        sched = Scheduler(config(), specs, SimGenerator(1e6, call_s=0.001), factory=SimFactory(domains),
                          workers=12, on_group=put, state=state, completed=store.__contains__,
                          load_group=store.__getitem__)
        taken = []
        async with sched:
            while groups := await sched.take(4):
                taken += groups
                sched.set_policy_version(f"resumed-{len(taken)}")
            return sched, taken, sched.metrics()

    sched, taken, m2 = asyncio.run(second_run())
    # what the store had but the trainer had not taken by the save reaches the trainer again,
    # from the store, flagged (never re-run: `put` would have raised)
    recovered = [g for g in taken if g.recovered]
    assert {g.group_id for g in recovered} == set(sched.recovered)
    assert all(g.trajectories == store[g.group_id] for g in recovered)
    dropped = {gid for gid, _ in sched.core.dropped}
    admitted = {f"{d}#{i}" for d, ds in sched.core.dom.items() for i in range(ds.next_index)}
    assert len(admitted) == GROUPS
    assert set(store) | dropped == admitted  # nothing lost
    assert not set(store) & dropped
    assert set(sched.recovered) <= stored_at_kill  # found in the store: not run again
    # groups open at the save and not stored were re-run, every member at (or, after a retry,
    # past) the attempt it was at: the same identity, so the same sampling seed
    rerun = open_at_save - stored_at_kill - dropped
    assert rerun
    launched = {g["gid"]: g for g in state["groups"]}
    for gid in rerun:
        for m, traj in enumerate(store[gid]):
            saved = launched[gid]
            assert traj.member == m and traj.attempt >= saved["attempts"][m]
    assert m2["counters"]["episodes_abandoned"] >= 1 and m2["lost"] == 0


def test_core_state_round_trip_keeps_deficits_windows_and_counters():
    clock = Clock()
    cfg = SchedulerConfig(group_size=2, max_running=4, max_staleness=1, groups_per_step=2, seed=3,
                          tiers=("train",), share_by="cost", starvation_s=None,
                          retry=RetryConfig(backoff_s=5.0, jitter=0.0))
    doms = [DomainSpec("a", weight=1.0), DomainSpec("b", weight=3.0, max_cost_share=0.9)]
    core = SchedulerCore(cfg, doms, clock=clock)
    for step in range(6):
        for i, spec in enumerate(launch_all(core)):
            clock.t += 1.0
            traj = fail(spec) if (step, i) == (2, 0) else ok(spec, float(i % 2))
            core.episode_finished(spec, traj, Usage(sandbox_s=1.0 + (spec.domain == "a")))
        if core.take(2):
            core.set_version(f"v{step}")
    assert launch_all(core)  # in flight at the save: re-issued on load
    state = json.loads(json.dumps(core.state_dict()))
    clock2 = Clock()
    clock2.t = 1000.0  # another process: its clock reads differently
    stored = set(core.ready["train"])  # on_group stored the ready groups
    assert stored
    again = SchedulerCore.from_state(state, cfg, doms, completed=stored, clock=clock2)
    for tier, fair in core.fair.items():
        for name in fair.names():
            assert again.fair[tier].tag(name) == pytest.approx(fair.tag(name))
            assert again.fair[tier].window_sums(name) == pytest.approx(fair.window_sums(name))
    assert again.staleness.state_dict() == core.staleness.state_dict()
    assert all(again.dom[d].next_index == ds.next_index for d, ds in core.dom.items())
    assert again.counters["groups_admitted"] == core.counters["groups_admitted"]
    assert set(again.ready["train"]) == stored and set(again.recovered) == stored
    # the same next decisions: the fair queue picks alike; re-issued groups launch first
    assert again.fair["train"].pick() == core.fair["train"].pick()
    reissued = [gid for gid in core.open["train"] if gid not in stored]
    assert reissued
    specs = launch_all(again)
    expect = [gid for gid in reissued for _ in range(2)][:len(specs)]
    assert [s.group_id for s in specs][:len(expect)] == expect
    saved = {g["gid"]: g for g in state["groups"]}
    for spec in specs[:len(expect)]:
        g = saved[spec.group_id]
        # the attempt it was at: the same identity and sampling seed as in the interrupted run
        assert spec.attempt == g["attempts"][spec.member]
    with pytest.raises(ValueError, match="seed"):
        SchedulerCore.from_state(state, SchedulerConfig(seed=4, tiers=("train",)), doms, completed=set())
    with pytest.raises(ValueError, match="format"):
        SchedulerCore.from_state({**state, "format": 99}, cfg, doms, completed=set())
