"""The asynchronous scheduler end to end: simulated and real episodes, batching, failures,
timeouts, stalls, metrics."""

import asyncio
import json
import time

import pytest

from posttrain.policies.scripted import ScriptedPolicy
from posttrain.scheduling import (
    AdaptiveConfig,
    BatchConfig,
    DomainSpec,
    EpisodeTimeout,
    QuarantineConfig,
    RetryConfig,
    Scheduler,
    SchedulerConfig,
    SchedulerStalled,
)
from posttrain.scheduling.episodes import RolloutEpisodeFactory
from posttrain.scheduling.sim import SimFactory, SimGenerator, make_domains
from posttrain.values.generation import Completion, GenerationRequest, Message, PolicyVersion
from tests.toydomains import CrashingVerifier, add_domain

FAST_RETRY = RetryConfig(max_retries=3, backoff_s=0.005, backoff_max_s=0.02)


def config(**kw) -> SchedulerConfig:
    base = dict(group_size=4, max_running=32, groups_per_step=4, max_staleness=1, max_groups=24,
                tiers=("eval", "train"), adaptive=AdaptiveConfig(enabled=False), retry=FAST_RETRY,
                batch=BatchConfig(max_batch=16, max_wait_s=0.002))
    base.update(kw)
    return SchedulerConfig(**base)


async def train(sched: Scheduler, per_step: int) -> list:
    out, version = [], 0
    while True:
        groups = await sched.take(per_step)
        if not groups:
            return out
        out += groups
        version += 1
        sched.set_policy_version(f"step-{version}")


def test_simulated_run_delivers_every_group_under_the_bound():
    domains = make_domains(8, seed=3, step_range=(0.001, 0.01), failure_rate=0.1, turns=(1, 3))
    failures = []

    async def main():
        async with Scheduler(config(), [DomainSpec(d.name) for d in domains],
                             SimGenerator(tokens_per_s=2e6, call_s=0.001), factory=SimFactory(domains),
                             workers=16, on_failure=lambda r: failures.append(r.trajectory)) as sched:
            groups = await train(sched, 4)
            return groups, sched.metrics()

    groups, m = asyncio.run(main())
    c = m["counters"]
    assert len(groups) + c["groups_dropped"] == 24 and len(groups) >= 20
    assert m["lost"] == 0 and c["episodes_abandoned"] == 0
    assert all(len(g.trajectories) == 4 and all(t.trainable for t in g.trajectories) for g in groups)
    assert all(t.group_id == g.group_id and t.policy_staleness <= 1 for g in groups for t in g.trajectories)
    assert len({g.group_id for g in groups}) == len(groups)
    # injected failures were retried with a higher attempt, and both failure kinds were seen
    assert c["retries"] > 0 and len(failures) == m["infra_errors"]
    wheres = {f.error.where for f in failures}
    assert "runner" in wheres and wheres - {"runner"}  # raised, and returned as infra_error
    assert any(t.attempt > 0 for g in groups for t in g.trajectories)
    assert m["batcher"]["mean_batch"] > 1  # requests from different episodes shared calls
    assert 0 < m["generator_busy"] <= 1 and 0 < m["worker_utilization"] <= 1
    d = m["domains"][domains[0].name]
    assert d["queue_wait_p50_s"] is not None and d["samples"] > 0 and d["quota"] == pytest.approx(1 / 8)
    assert m["staleness"]["max"] <= 1
    json.loads(json.dumps(m))  # goes to the metrics JSONL as is


def test_real_episodes_with_scripted_policy_and_a_crashing_verifier():
    doms = {"toy.add": add_domain(), "toy.crash": add_domain("toy.crash", CrashingVerifier())}
    failures, stored = [], []

    async def main():
        cfg = config(group_size=2, max_groups=6, quarantine=QuarantineConfig(window=4, min_episodes=4,
                                                                           max_error_rate=0.5))
        factory = RolloutEpisodeFactory(doms)
        sched = Scheduler(cfg, [DomainSpec("toy.add"), DomainSpec("toy.crash")],
                          ScriptedPolicy.oracle(), factory=factory, tasks=factory, workers=4,
                          on_failure=lambda r: failures.append(r.trajectory), on_group=stored.append)
        async with sched:
            return await train(sched, 2), sched.metrics()

    groups, m = asyncio.run(main())
    assert groups and {g.domain for g in groups} == {"toy.add"}
    for g in groups:
        assert [t.reward for t in g.trajectories] == [1.0, 1.0]
        task = doms["toy.add"].task(g.task_seed)
        assert all(t.task_hash == task.hash and t.group_id == g.group_id for t in g.trajectories)
    assert {g.group_id for g in stored} == {g.group_id for g in groups}  # on_group saw each one
    assert failures and all(f.error.where == "verifier" and f.reward is None for f in failures)
    assert "toy.crash" in m["quarantined"]  # and training went on with the rest
    assert m["lost"] == 0


class FlakyPolicy:
    """Fails its first `fail_calls` generate calls as a whole (a backend outage)."""

    def __init__(self, fail_calls: int) -> None:
        self.version = PolicyVersion("flaky")
        self.fail_calls = fail_calls
        self.calls = 0

    def generate(self, requests):
        self.calls += 1
        if self.calls <= self.fail_calls:
            raise ConnectionError("backend down")
        return [Completion(text="ok", finish_reason="stop", token_ids=[1, 2]) for _ in requests]


def test_batcher_retries_a_failed_call_then_reports_errors_per_request():
    from posttrain.scheduling.batcher import GenerationBatcher

    req = GenerationRequest(messages=(Message("user", "q"),))

    async def run(policy, retries):
        b = GenerationBatcher(policy, BatchConfig(max_batch=8, max_wait_s=0.01, retries=retries,
                                                  retry_backoff_s=0.001))
        b.start()
        try:
            return await asyncio.gather(*(b.generate(req) for _ in range(5))), b.metrics()
        finally:
            await b.close()

    out, m = asyncio.run(run(FlakyPolicy(1), retries=2))
    assert [c.finish_reason for c, _, _ in out] == ["stop"] * 5
    assert m["calls"] == 1 and m["failed_calls"] == 1 and m["requests"] == 5 and m["tokens"] == 10
    out, m = asyncio.run(run(FlakyPolicy(10), retries=1))
    assert all(c.finish_reason == "error" and "backend down" in c.error for c, _, _ in out)
    assert m["failed_requests"] == 5


def test_batcher_does_not_cut_a_burst_of_requests_that_outlasts_max_wait():
    """Episodes started in one pass of the event loop ask together, even when starting them
    takes longer than `max_wait_s` (a model's cost is per call); a request that comes later,
    after the burst, waits at most `max_wait_s` as before. Two generator threads lose nothing."""
    from posttrain.scheduling.batcher import GenerationBatcher

    req = GenerationRequest(messages=(Message("user", "q"),))

    async def episode(b):
        time.sleep(0.002)  # a slow start: the burst of 30 lasts ~60 ms, 30x max_wait_s
        return await b.generate(req)

    async def run(inflight):
        b = GenerationBatcher(FlakyPolicy(0), BatchConfig(max_batch=64, max_wait_s=0.002,
                                                          max_inflight=inflight))
        b.start()
        try:
            out = await asyncio.gather(*(episode(b) for _ in range(30)))
            late = await asyncio.gather(b.generate(req))
            return out + late, b.metrics()
        finally:
            await b.close()

    for inflight in (1, 2):
        out, m = asyncio.run(run(inflight))
        assert [c.finish_reason for c, _, _ in out] == ["stop"] * 31
        assert m["calls"] == 2 and m["requests"] == 31, m


class SlowEpisode:
    def __init__(self, spec):
        self.spec = spec

    def start(self):
        return GenerationRequest(messages=(Message("user", "q"),))

    def advance(self, completion):
        time.sleep(0.5)  # longer than the episode timeout
        return None

    def result(self):
        raise AssertionError("never reached: the episode timed out")


def test_episode_timeout_is_an_infra_error_retried_then_dropped():
    failures = []

    async def main():
        cfg = config(group_size=1, max_groups=1, retry=RetryConfig(max_retries=1, backoff_s=0.0,
                                                                   episode_timeout_s=0.1))
        async with Scheduler(cfg, [DomainSpec("slow")], FlakyPolicy(0), factory=SlowEpisode, workers=4,
                             on_failure=lambda r: failures.append(r.trajectory)) as sched:
            await sched.wait_finished()
            return sched.metrics()

    m = asyncio.run(main())
    assert [f.error.type for f in failures] == [EpisodeTimeout.__name__] * 2
    assert [f.attempt for f in failures] == [0, 1]
    assert m["counters"]["groups_dropped"] == 1 and m["lost"] == 0


def test_stall_is_reported_not_waited_on():
    domains = make_domains(1, seed=1, step_range=(0.001, 0.002), failure_rate=1.0)

    async def main():
        cfg = config(group_size=2, max_groups=None, quarantine=QuarantineConfig(window=4, min_episodes=2),
                     retry=RetryConfig(max_retries=0, backoff_s=0.0))
        async with Scheduler(cfg, [DomainSpec(domains[0].name)], SimGenerator(1e6),
                             factory=SimFactory(domains), workers=4) as sched:
            await asyncio.wait_for(sched.take(1), 20)

    with pytest.raises(SchedulerStalled, match="quarantined"):
        asyncio.run(main())

    async def no_version_bump():
        ok = make_domains(1, seed=1, step_range=(0.001, 0.002), failure_rate=0.0)
        cfg = config(group_size=1, max_groups=None, max_staleness=0, groups_per_step=1)
        async with Scheduler(cfg, [DomainSpec(ok[0].name)], SimGenerator(1e6), factory=SimFactory(ok),
                             workers=2) as sched:
            await sched.take(1)
            await asyncio.wait_for(sched.take(1), 20)  # the trainer forgot set_policy_version

    with pytest.raises(SchedulerStalled, match="set_policy_version"):
        asyncio.run(no_version_bump())


def test_an_evaluation_set_runs_to_the_end_in_its_tier():
    domains = make_domains(3, seed=2, step_range=(0.001, 0.003), failure_rate=0.0)

    async def main():
        cfg = config(group_size=2, max_groups=None)
        specs = [DomainSpec(d.name, tier="eval", split="eval", continuous=False) for d in domains]
        async with Scheduler(cfg, specs, SimGenerator(1e6), factory=SimFactory(domains), workers=4) as sched:
            for d in domains:
                sched.submit(d.name, 2)
            await asyncio.wait_for(sched.wait_finished(), 20)
            return await sched.take_ready("eval", 6), sched.metrics()

    groups, m = asyncio.run(main())
    assert sorted(g.group_id for g in groups) == sorted(f"{d.name}#{i}" for d in domains for i in range(2))
    assert all(t.split == "eval" and t.trainable for g in groups for t in g.trajectories)
    assert m["lost"] == 0 and m["staleness"]["accepted"] == 0  # not trainer work


def test_take_more_gets_extra_groups_of_the_same_version_under_a_synchronous_bound():
    """Dynamic sampling through the asynchronous scheduler: with max_staleness 0 a second take
    for the same update would stall; `take_more` extends the admissions and gets groups that the
    same version generated."""
    domains = make_domains(4, seed=5, step_range=(0.001, 0.003), failure_rate=0.0, turns=(1, 2))

    async def main():
        async with Scheduler(config(max_staleness=0, max_groups=None), [DomainSpec(d.name) for d in domains],
                             SimGenerator(tokens_per_s=2e6, call_s=0.001), factory=SimFactory(domains),
                             workers=8) as sched:
            first = await sched.take(4)
            more = await asyncio.wait_for(sched.take_more(4), 30)
            sched.set_policy_version("step-1")
            after = await asyncio.wait_for(sched.take(4), 30)
            return first, more, after

    first, more, after = asyncio.run(main())
    assert len(first) == len(more) == len(after) == 4
    assert {g.version for g in first + more} == {0} and {g.staleness for g in first + more} == {0}
    assert {g.version for g in after} == {1} and {g.staleness for g in after} == {0}


class PickyPolicy:
    """Raises for a whole call when any request in it asks for `bad` (a policy that validates
    a batch up front), else answers every request."""

    def __init__(self, bad: str) -> None:
        self.version = PolicyVersion("picky")
        self.bad, self.sizes = bad, []

    def generate(self, requests):
        self.sizes.append(len(requests))
        if any(r.messages[0].content == self.bad for r in requests):
            raise ValueError(f"cannot render {self.bad!r}")
        return [Completion(text="ok", finish_reason="stop", token_ids=[1]) for _ in requests]


def test_batcher_isolates_the_request_that_makes_a_call_raise():
    """One bad request in a batch of 16 fails alone (its error named), the 15 others are answered,
    in about 2·log2(16) extra calls; a backend outage (both halves raise) is not bisected down."""
    from posttrain.scheduling.batcher import GenerationBatcher

    async def run(policy, prompts, retries=1):
        b = GenerationBatcher(policy, BatchConfig(max_batch=16, max_wait_s=0.01, retries=retries,
                                                  retry_backoff_s=0.001))
        b.start()
        try:
            reqs = [GenerationRequest(messages=(Message("user", p),)) for p in prompts]
            return await asyncio.gather(*(b.generate(r) for r in reqs)), b.metrics()
        finally:
            await b.close()

    prompts = [f"q{i}" for i in range(16)]
    prompts[11] = "bad"
    policy = PickyPolicy("bad")
    out, m = asyncio.run(run(policy, prompts))
    reasons = [c.finish_reason for c, _, _ in out]
    assert reasons == ["stop"] * 11 + ["error"] + ["stop"] * 4
    assert "cannot render 'bad'" in out[11][0].error
    assert m["tokens"] == 15 and m["failed_requests"] == 1
    # 16 -> 8+8 -> 4+4 -> 2+2 -> 1+1 isolates it; then one retry of it alone
    assert policy.sizes == [16, 8, 8, 4, 4, 2, 2, 1, 1, 1]
    # an outage: both halves raise, so the group is retried whole, not split down to singles
    down = FlakyPolicy(100)
    out, m = asyncio.run(run(down, prompts, retries=1))
    assert all(c.finish_reason == "error" and "backend down" in c.error for c, _, _ in out)
    assert down.calls == 6  # per attempt: the batch and its two halves
