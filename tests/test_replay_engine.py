"""Replay is a workload on the one episode engine: every trajectory of a call is one item of one
workload, its requests batched with the others' and each answered from its own recording; an
infrastructure failure is reported for the first such trajectory in the order given."""

from __future__ import annotations

from dataclasses import replace

import pytest

import posttrain.scheduling.replay as replay_mod
from posttrain.policies.scripted import ScriptedPolicy
from posttrain.rollout.replay import ReplayInfraError
from posttrain.scheduling.engine import WorkItem, run_workload
from posttrain.scheduling.replay import replay, replay_many
from posttrain.storage.store import Store
from posttrain.tasks.registry import get_domain
from posttrain.values.trajectory import ErrorInfo, Trajectory


def _record(store: Store, domain: str, seeds: range, role: str) -> list[Trajectory]:
    d = get_domain(domain)
    policy = ScriptedPolicy.named(role)
    out: list[Trajectory] = []

    def keep(r):
        store.put_trajectory(r.trajectory, r.task, r.workspace_archive)
        out.append(r.trajectory)

    run_workload([WorkItem(d, d.task(s, "train")) for s in seeds], policy, player=policy, on_result=keep)
    return [store.get_trajectory(t.id) for t in out]


def test_one_workload_replays_every_trajectory_from_its_own_recording(tmp_path, monkeypatch):
    calls, batches = [], []
    real_run, real_generate = replay_mod.run_workload, replay_mod._RoutedReplay.generate

    def spy_run(items, policy, **kw):
        calls.append(len(items))
        return real_run(items, policy, **kw)

    def spy_generate(self, requests):
        batches.append(len(requests))
        return real_generate(self, requests)

    monkeypatch.setattr(replay_mod, "run_workload", spy_run)
    monkeypatch.setattr(replay_mod._RoutedReplay, "generate", spy_generate)
    with Store.for_run_dir(tmp_path) as store:
        store.start_run("r", {})
        passed = _record(store, "math.add.d2", range(3), "oracle")
        failed = _record(store, "math.add.d2", range(3), "wrong")
        trajs = [t for pair in zip(passed, failed) for t in pair]  # interleaved: routing must not mix them
        assert [t.passed for t in trajs] == [True, False] * 3
        results = replay_many(store, trajs)
    assert [r.trajectory_id for r in results] == [t.id for t in trajs]
    assert all(r.matched for r in results), [r.divergence for r in results if not r.matched]
    assert [r.verdict["replayed"]["passed"] for r in results] == [True, False] * 3
    assert calls == [6], "one workload on the engine for the whole call"
    assert max(batches) > 1, "requests of several replayed episodes are batched together"


def test_a_replay_answered_from_another_recording_diverges(tmp_path):
    """The comparison is not vacuous: an oracle's actions replayed as a wrong answer's recording
    are caught at the verdict."""
    with Store.for_run_dir(tmp_path) as store:
        store.start_run("r", {})
        (good,) = _record(store, "math.add.d2", range(1), "oracle")
        (bad,) = _record(store, "math.add.d2", range(1), "wrong")
        forged = replace(good, turns=bad.turns)
        result = replay(store, forged)
    assert not result.matched and result.divergence is not None
    assert result.divergence["field"] in ("observation", "verdict"), result.divergence


def test_the_first_infrastructure_failure_in_order_is_reported(tmp_path):
    with Store.for_run_dir(tmp_path) as store:
        store.start_run("r", {})
        first, second = _record(store, "terminal.config.comment-out", range(2), "oracle")
        lost = replace(first, id="lost", status="infra_error", reward=None, verdict=None,
                       error=ErrorInfo("SandboxError", "died"))
        assert replay_many(store, [lost])[0].divergence == {
            "turn": None, "field": "status", "stored": "infra_error", "replayed": "not replayable"}

        def no_sandbox():
            raise RuntimeError("no sandbox today")

        with pytest.raises(ReplayInfraError, match=f"replay of {second.id} failed on infrastructure: "
                                                   "RuntimeError: no sandbox today"):
            replay_many(store, [lost, second, first], sandbox_factory=no_sandbox)
        assert all(r.matched for r in replay_many(store, [first, second]))
