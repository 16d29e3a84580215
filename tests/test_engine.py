"""The one episode engine: results travel intact, failures stay local, sandboxes stay bounded."""

from __future__ import annotations

import asyncio
import threading
import time
from contextlib import contextmanager

import pytest

from posttrain.policies.scripted import ScriptedPolicy
from posttrain.scheduling import BatchConfig, DomainSpec, RetryConfig, Scheduler, SchedulerConfig
from posttrain.scheduling.batcher import GenerationBatcher
from posttrain.scheduling.engine import WorkItem, run_workload
from posttrain.scheduling.episodes import RolloutEpisodeFactory
from posttrain.scheduling.versions import VersionInfraRate
from posttrain.tasks.domain import Domain
from posttrain.values.generation import Completion, GenerationRequest, Message, PolicyVersion
from posttrain.values.task import Task
from posttrain.values.verdict import Verdict


class _Exact:
    name, version, needs_sandbox = "exact-toy", "1", False

    def verify(self, task, outcome):
        ok = (outcome.answer or "").strip() == task.reference["answer"]
        return Verdict(passed=ok, score=float(ok), verifier_version=f"{self.name}@{self.version}")


def toy_domain(name: str = "toy.add", env: str = "single") -> Domain:
    def generate(seed: int, split: str) -> Task:
        a, b = seed % 97, (seed * 7) % 89
        return Task(domain=name, prompt=f"{a}+{b}=", reference={"answer": str(a + b)}, env=env,
                    split=split, seed=seed)

    return Domain(name=name, family="toy", env=env, verifier=_Exact(), generate=generate,
                  oracle=lambda t: [t.reference["answer"]], negatives=lambda t: {"empty": [""], "wrong": ["-1"]})


# -- the latent bug: a failed episode is stored against its own task ---------------------------

class _Hangs:
    """Hangs on the request of one task key, so the engine times its episode out."""

    version = PolicyVersion("hangs")

    def __init__(self, slow_key: str) -> None:
        self.slow_key = slow_key

    def generate(self, requests):
        if any(r.meta["task_key"] == self.slow_key for r in requests):
            time.sleep(1.5)
        return [Completion(text="0", finish_reason="stop") for _ in requests]


def test_a_timed_out_episode_is_recorded_against_its_own_task():
    domain = toy_domain()
    eval_task = domain.task(11, "eval")  # an eval-split task: nothing may rebuild it as 'train'
    failures = []

    async def main():
        factory = RolloutEpisodeFactory({domain.name: domain}, tasks={"g": eval_task})
        cfg = SchedulerConfig(group_size=1, tiers=("work", "train"), trainer_tier="train",
                              retry=RetryConfig(max_retries=0, episode_timeout_s=0.3, policy_outage_s=None))
        sched = Scheduler(cfg, [DomainSpec(domain.name, tier="work", continuous=False)], _Hangs(eval_task.key),
                          factory=factory, tasks=factory, workers=2, on_failure=failures.append)
        async with sched:
            sched.submit(domain.name, group_ids=["g"])
            await sched.wait_finished()

    asyncio.run(main())
    (result,) = failures
    traj = result.trajectory
    assert traj.status == "infra_error" and traj.error.type == "EpisodeTimeout"
    # its own task, intact: the key, hash, split and seed of the eval task it ran
    assert result.task == eval_task
    assert (traj.task_key, traj.task_hash, traj.split, traj.seed) == (
        eval_task.key, eval_task.hash, "eval", eval_task.seed)


def test_a_group_hands_its_tasks_and_workspaces_to_the_store_intact():
    domain = toy_domain()
    stored = []

    async def main():
        factory = RolloutEpisodeFactory({domain.name: domain})
        cfg = SchedulerConfig(group_size=2, max_groups=2, groups_per_step=1, max_staleness=None)
        sched = Scheduler(cfg, [DomainSpec(domain.name)], ScriptedPolicy.oracle(), factory=factory,
                          tasks=factory, workers=2, on_group=stored.append)
        async with sched:
            await sched.wait_finished()

    asyncio.run(main())
    assert len(stored) == 2
    for group in stored:
        expected = domain.task(group.task_seed, "train")
        for r in group.results:
            assert r.task == expected and r.trajectory.task_hash == expected.hash
            assert r.trajectory.seed == expected.seed and r.trajectory.passed


# -- scripted policies never see the task ----------------------------------------------------

def test_requests_carry_routing_ids_only():
    domain = toy_domain()
    seen = []

    class Spy(ScriptedPolicy):
        def generate(self, requests):
            seen.extend(requests)
            return super().generate(requests)

    (attempts,) = run_workload([WorkItem(domain, domain.task(3), "g3")], Spy("oracle"))
    assert attempts[0].trajectory.passed
    assert seen and all(set(r.meta) == {"episode", "domain", "task_key", "turn", "group_id"} for r in seen)
    assert not any(isinstance(v, Task) for r in seen for v in r.meta.values())


# -- a failed request fails alone -----------------------------------------------------------

class _FailsOne:
    """Fails the request of one task key the first `times` times it sees it; answers the rest."""

    version = PolicyVersion("fails-one")

    def __init__(self, bad_key: str, times: int) -> None:
        self.bad_key, self.times = bad_key, times
        self.calls: list[list[str]] = []

    def generate(self, requests):
        self.calls.append([r.meta["task_key"] for r in requests])
        out = []
        for r in requests:
            if r.meta["task_key"] == self.bad_key and self.times > 0:
                self.times -= 1
                out.append(Completion(text="", finish_reason="error", error="server hiccup"))
            else:
                out.append(Completion(text=r.meta["task_key"], finish_reason="stop"))
        return out


def _request(key: str) -> GenerationRequest:
    return GenerationRequest((Message("user", key),), request_id=key, meta={"task_key": key})


def _batch(policy, keys, retries=2):
    async def main():
        b = GenerationBatcher(policy, BatchConfig(max_batch=len(keys), max_wait_s=0.05, retries=retries,
                                                  retry_backoff_s=0.0))
        b.start()
        try:
            return await asyncio.gather(*(b.generate(_request(k)) for k in keys)), b.metrics()
        finally:
            await b.close()
    return asyncio.run(main())


def test_a_failed_request_is_retried_alone_and_the_others_are_kept():
    keys = [f"k{i}" for i in range(6)]
    policy = _FailsOne("k3", times=1)
    outs, m = _batch(policy, keys)
    assert [c.text for c, _, _ in outs] == keys  # all answered, k3 on its retry
    assert policy.calls[0] == keys and policy.calls[1:] == [["k3"]]  # only k3 went again
    assert m["retried_requests"] == 1 and m["failed_requests"] == 0


def test_a_request_that_keeps_failing_fails_only_itself():
    keys = [f"k{i}" for i in range(4)]
    outs, m = _batch(_FailsOne("k1", times=99), keys, retries=1)
    assert [c.finish_reason for c, _, _ in outs] == ["stop", "error", "stop", "stop"]
    assert m["failed_requests"] == 1


# -- bounded sandboxes -----------------------------------------------------------------------

class _CountingSandboxes:
    """A fake sandbox factory that counts how many sandboxes are alive at once."""

    def __init__(self) -> None:
        self.live = self.peak = self.opened = 0
        self._lock = threading.Lock()

    @contextmanager
    def __call__(self):
        with self._lock:
            self.live += 1
            self.opened += 1
            self.peak = max(self.peak, self.live)
        try:
            yield _FakeSandbox()
        finally:
            with self._lock:
                self.live -= 1


class _FakeSandbox:
    class info:
        backend, image, layers, clock = "fake", "none", {}, None

    def write_file(self, path, content):
        pass

    def kill_processes(self):
        return 0

    def archive(self):
        return b"workspace"

    def snapshot(self):
        return "snap"


@pytest.mark.parametrize("limit", [None, 5])
def test_live_sandboxes_never_exceed_the_workers_whatever_the_episodes(limit):
    # A tools episode holds its sandbox from reset to its end, across its wait for generation.
    base = toy_domain("toy.boxed", env="tools")
    domain = Domain(name=base.name, family="toy", env="tools", verifier=base.verifier, generate=base.generate,
                    oracle=lambda t: [f"<submit>{t.reference['answer']}</submit>"], negatives=base.negatives)
    boxes = _CountingSandboxes()
    items = [WorkItem(domain, domain.task(s)) for s in range(60)]
    results = run_workload(items, ScriptedPolicy.oracle(), workers=3, sandbox_factory=boxes,
                           max_sandboxes=limit)
    assert all(r[-1].trajectory.passed for r in results)
    assert all(r[-1].workspace_archive == b"workspace" for r in results)
    assert boxes.opened == 60 and boxes.live == 0
    assert 1 <= boxes.peak <= (limit or 3)


# -- tokenizer identity and infra rate per policy version ------------------------------------

def test_the_policy_tokenizer_hash_is_recorded_on_every_trajectory():
    domain = toy_domain()

    class WithTokenizer(ScriptedPolicy):
        def __init__(self):
            super().__init__("oracle")
            self.version = PolicyVersion("tok", tokenizer_hash="ab" * 32)

    results = run_workload([WorkItem(domain, domain.task(s)) for s in range(3)], WithTokenizer())
    assert [r[-1].trajectory.tokenizer_hash for r in results] == ["ab" * 32] * 3


def test_a_version_whose_infra_rate_jumps_is_flagged_once(caplog):
    rates = VersionInfraRate(min_episodes=10, jump=0.1, factor=2.0)
    for i in range(40):
        assert rates.record("v1", i % 20 == 0) is None  # 5%: the baseline
    for _ in range(9):
        assert rates.record("v2", True) is None  # not enough episodes yet
    with caplog.at_level("WARNING"):
        report = rates.record("v2", True)
    assert report is not None and report["rate"] == 1.0 and report["baseline"] == 0.05
    assert "v2" in caplog.text
    assert rates.record("v2", True) is None  # flagged once
    assert rates.metrics()["flagged"].keys() == {"v2"}
    for i in range(20):
        rates.record("v3", i % 20 == 0)
    assert "v3" not in rates.flagged  # a normal rate is not flagged


def test_the_scheduler_reports_infra_rate_per_version():
    domain = toy_domain()
    failing = ScriptedPolicy.negative("no-such-negative")  # every request fails: no script

    async def main():
        factory = RolloutEpisodeFactory({domain.name: domain})
        cfg = SchedulerConfig(group_size=1, tiers=("work", "train"), trainer_tier="train",
                              retry=RetryConfig(max_retries=0, policy_outage_s=None))
        sched = Scheduler(cfg, [DomainSpec(domain.name, tier="work", continuous=False)], failing,
                          factory=factory, tasks=factory, workers=2, version_name="v7")
        async with sched:
            sched.submit(domain.name, 3)
            await sched.wait_finished()
            return sched.metrics()

    m = asyncio.run(main())
    assert m["policy_versions"]["by_version"]["v7"] == {"episodes": 3, "infra_errors": 3, "rate": 1.0}


def test_an_unknown_env_kind_is_named():
    from posttrain.envs import UnknownEnvKind, make_env

    d = toy_domain()
    bad = Domain(name="toy.bad", family="toy", env="nope", verifier=d.verifier, generate=d.generate,
                 oracle=d.oracle, negatives=d.negatives)
    with pytest.raises(UnknownEnvKind, match="toy.bad: env 'nope'"):
        make_env(bad)
