"""Light episodes without a task per episode (`Scheduler._inline_*`): the same results as the task
path, and the same accounting when a run is torn down or the scheduler itself fails."""

from __future__ import annotations

import asyncio
import gc
import hashlib
import threading
import time
from collections.abc import Mapping, Sequence

import pytest

from posttrain.evaluation import EvalConfig, run_eval
from posttrain.policies.scripted import ScriptedPolicy
from posttrain.scheduling import DomainSpec, RetryConfig, Scheduler, SchedulerConfig
from posttrain.scheduling.engine import old_objects_frozen
from posttrain.scheduling.episodes import RolloutEpisodeFactory
from posttrain.tasks.domain import Domain
from posttrain.values.generation import Completion, PolicyVersion
from posttrain.values.task import Task
from posttrain.values.verdict import Verdict

TIMING_FIELDS = ("gen_s", "tool_s", "verify_s", "sandbox_s", "total_s", "trajectory_id")


class _Exact:
    name, version, needs_sandbox = "exact-toy", "1", False

    def verify(self, task, outcome):
        ok = (outcome.answer or "").strip() == task.reference["answer"]
        return Verdict(passed=ok, score=float(ok), verifier_version=f"{self.name}@{self.version}")


def toy_domain(name: str) -> Domain:
    """An in-process single-answer domain (no registry to load: these tests stay fast)."""

    def generate(seed: int, split: str) -> Task:
        a, b = seed % 97, (seed * 7) % 89
        return Task(domain=name, prompt=f"{a}+{b}=", reference={"answer": str(a + b)}, env="single",
                    split=split, seed=seed)

    return Domain(name=name, family="toy", env="single", verifier=_Exact(), generate=generate,
                  oracle=lambda t: [t.reference["answer"]], negatives=lambda t: {"wrong": ["-1"]})


def toy_tasks(names: Sequence[str], per_domain: int):
    return [(d, d.task(seed, "eval")) for d in map(toy_domain, names) for seed in range(per_domain)]


class _Mixed:
    """A scripted player that, by a stable hash of each group id, answers right, answers wrong
    or fails (an error completion: an infra_error, retried): every outcome in one run."""

    version = PolicyVersion("mixed")
    roles = ("oracle", "wrong")

    def __init__(self) -> None:
        self.scripts: dict[str, Mapping[str, Sequence[str]] | str] = {}

    def assign(self, route: str, scripts: Mapping[str, Sequence[str]]) -> None:
        self.scripts[route] = scripts

    def refuse(self, route: str, reason: str) -> None:
        self.scripts[route] = reason

    def generate(self, requests):
        out = []
        for req in requests:
            route = str(req.meta["group_id"])
            scripts = self.scripts.get(route)
            kind = hashlib.sha256(route.encode()).digest()[0] % 3
            if kind == 0 or not isinstance(scripts, Mapping):
                out.append(Completion(text="", finish_reason="error", error="mixed: no answer"))
                continue
            actions = scripts["oracle" if kind == 1 else "wrong"]
            turn = int(req.meta.get("turn", 0))
            out.append(Completion(text=actions[turn] if turn < len(actions) else "", finish_reason="stop"))
        return out


def _evaluate(monkeypatch, by_callback: bool):
    calls = {"tasks": 0}
    episode = Scheduler._episode

    async def counted(self, spec):
        calls["tasks"] += 1
        await episode(self, spec)

    with monkeypatch.context() as m:
        m.setattr(Scheduler, "_episode", counted)
        m.setattr(time, "sleep", lambda s: None)  # the batcher's backoff before re-asking a failed request
        if not by_callback:
            m.setattr(Scheduler, "_callback_domains", lambda self: frozenset())
        tasks = toy_tasks(["toy.a", "toy.b", "toy.c"], per_domain=6)
        result = run_eval(_Mixed(), tasks, EvalConfig(k=(1, 2), retries=1, workers=2), name="mixed")
    return result, calls["tasks"]


def _plain(result):
    records = []
    for rec in result.records:
        d = rec.to_dict()
        d["samples"] = [{k: v for k, v in s.items() if k not in TIMING_FIELDS} for s in d["samples"]]
        records.append(d)
    return records


def test_light_episodes_by_callback_give_the_task_paths_records(monkeypatch):
    inline, inline_tasks = _evaluate(monkeypatch, by_callback=True)
    tasked, tasked_tasks = _evaluate(monkeypatch, by_callback=False)
    assert inline_tasks == 0  # no asyncio task per episode on the callback path
    assert tasked_tasks > 0  # the comparison ran the task path
    statuses = {s.status for rec in inline.records for s in rec.samples}
    assert statuses == {"completed", "infra_error"}
    assert {s.passed for rec in inline.records for s in rec.samples} == {True, False, None}
    assert any(s.attempt == 1 for rec in inline.records for s in rec.samples)  # retried
    assert _plain(inline) == _plain(tasked)
    for key in ("macro_pass1", "micro_pass1", "infra_error_rate", "episodes"):
        assert inline.summary[key] == tasked.summary[key]


class _Slow:
    version = PolicyVersion("slow")

    def generate(self, requests):
        time.sleep(0.3)
        return [Completion(text="0", finish_reason="stop") for _ in requests]


def _scheduler(policy, domain, **retry):
    factory = RolloutEpisodeFactory({domain.name: domain})
    cfg = SchedulerConfig(group_size=1, tiers=("work", "train"), trainer_tier="train",
                          retry=RetryConfig(policy_outage_s=None, **retry))
    return Scheduler(cfg, [DomainSpec(domain.name, tier="work", continuous=False, light=True)], policy,
                     factory=factory, tasks=factory, workers=2)


class _Blocked:
    """Answers only once `release` is set: its requests are in flight until then."""

    version = PolicyVersion("blocked")

    def __init__(self) -> None:
        self.asked, self.release = threading.Event(), threading.Event()

    def generate(self, requests):
        self.asked.set()
        self.release.wait(10)
        return [Completion(text="0", finish_reason="stop") for _ in requests]


@pytest.mark.parametrize("started", [False, True])
def test_closing_abandons_light_episodes_in_flight(started):
    domain = toy_domain("toy.a")
    policy = _Blocked()

    async def main():
        sched = _scheduler(policy, domain)
        async with sched:
            sched.submit(domain.name, n_groups=3)
            if started:  # waiting for their completions; else not yet started at all
                while not policy.asked.is_set():
                    await asyncio.sleep(0.01)
                assert sched.batcher.calls == 0 and len(sched._inline) == 3
        return sched

    try:
        sched = asyncio.run(main())
    finally:
        policy.release.set()
    assert not sched._tasks  # light episodes: none was a task
    assert sched.core.counters["episodes_abandoned"] == 3
    assert sched.core.running_total == 0
    assert sched.core.counters.get("episodes_kept", 0) == 0


def test_a_deadline_puts_light_episodes_back_on_tasks():
    sched = _scheduler(_Slow(), toy_domain("toy.a"), episode_timeout_s=5.0)
    assert sched._by_callback == frozenset()
    assert _scheduler(_Slow(), toy_domain("toy.a"))._by_callback == {"toy.a"}


def test_a_scheduler_bug_on_the_callback_path_surfaces():
    domain = toy_domain("toy.a")

    async def main():
        sched = _scheduler(_Slow(), domain)

        def broken(*args, **kwargs):
            raise KeyError("bookkeeping bug")

        sched.core.episode_finished = broken
        async with sched:
            sched.submit(domain.name, n_groups=2)
            await sched.wait_finished()

    with pytest.raises(RuntimeError, match="the scheduler failed: KeyError"):
        asyncio.run(main())


def test_old_objects_stay_frozen_until_the_outermost_block_ends():
    assert gc.get_freeze_count() == 0
    with old_objects_frozen():
        assert gc.get_freeze_count() > 0
        with old_objects_frozen():  # a workload inside an evaluation
            pass
        # the inner end did not give them back (some may have died meanwhile: not all are counted)
        assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0


def test_the_task_is_the_last_field_of_an_episode_spec():
    # `Scheduler._with_task` puts the resolved task in the last place of the spec
    from posttrain.scheduling.work import EpisodeSpec

    assert EpisodeSpec._fields[-1] == "task"


def test_a_finished_workload_is_freed_without_waiting_for_a_full_collection():
    # the engine hands each group over as it completes; nothing it leaves behind is in a reference
    # cycle, which would keep every trajectory of the run alive until a full collection
    tasks = toy_tasks(["toy.a"], per_domain=4)
    gc.collect()
    gc.disable()
    try:
        result = run_eval(ScriptedPolicy.named("oracle"), tasks, EvalConfig(k=(1,), workers=2), name="cycles")
        assert len(result.records) == 4
        del result
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        leaked = {type(o).__name__ for o in gc.garbage} & {"Trajectory", "EpisodeResult", "GroupState", "Group"}
        assert leaked == set()
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
