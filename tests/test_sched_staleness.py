"""The staleness bound as pure counters (no model, no clock), and through the core's `take`."""

import random

import pytest

from posttrain.scheduling import AdaptiveConfig, DomainSpec, SchedulerConfig, SchedulerCore, Usage
from posttrain.scheduling.staleness import StalenessController
from posttrain.values.episode import EpisodeResult
from posttrain.values.trajectory import Trajectory


def test_areal_admission_rule():
    c = StalenessController(max_staleness=1, groups_per_step=4)
    assert c.capacity() == 8  # (1 + 0 + 1) * 4
    for _ in range(8):
        c.admit()
    assert not c.can_admit()
    with pytest.raises(RuntimeError, match="staleness bound"):
        c.admit()
    c.accept()  # a completion does not free a slot: accepted + running is unchanged
    assert not c.can_admit()
    c.reject()  # a dropped group does
    assert c.can_admit() and c.running == 6 and c.accepted == 1
    c.set_version(1)
    assert c.capacity() == 12
    with pytest.raises(ValueError, match="backwards"):
        c.set_version(0)
    with pytest.raises(RuntimeError, match="never admitted"):
        StalenessController(0, 1).accept()


def test_unbounded_and_bad_settings():
    c = StalenessController(max_staleness=None, groups_per_step=2)
    for _ in range(100):
        c.admit()
    assert c.capacity() is None and c.required([0] * 100) == 0
    with pytest.raises(ValueError, match="max_staleness"):
        StalenessController(-1, 2)
    with pytest.raises(ValueError, match="groups_per_step"):
        StalenessController(1, 0)
    with pytest.raises(ValueError, match="'running'"):
        StalenessController(1, 1).load_state_dict({"version": 0, "accepted": 0, "running": -1})


def test_required_counts_groups_that_would_overrun():
    c = StalenessController(max_staleness=2, groups_per_step=2)
    # at version 0 with six version-0 groups outstanding: four must go within the next two
    # batches of two, so this batch needs the two oldest
    assert c.required([0] * 6) == 2
    assert c.required([0] * 4) == 0
    c.set_version(2)
    assert c.required([0, 0, 1, 2]) == 2  # the version-0 ones are due now
    assert c.required([1, 1, 1, 1, 2, 2]) == 2  # due next step: 4 - 1 * 2


def _traj(domain: str, reward: float = 1.0) -> Trajectory:
    return Trajectory(task_key="k", task_hash="h", domain=domain, split="train", policy_version="v",
                      status="completed", reward=reward)


@pytest.mark.parametrize("max_staleness", [0, 1, 3])
def test_staleness_never_exceeds_bound_with_out_of_order_completion(max_staleness):
    rng = random.Random(max_staleness)
    B = 3
    cfg = SchedulerConfig(group_size=2, max_running=40, groups_per_step=B, max_staleness=max_staleness,
                          tiers=("train",), adaptive=AdaptiveConfig(enabled=False))
    core = SchedulerCore(cfg, [DomainSpec(f"d{i}") for i in range(5)], clock=lambda: 0.0)
    running, seen = [], []  # (finish step, spec)
    for step in range(150):
        while (spec := core.next_episode()) is not None:
            # heavy-tailed durations: most finish next step, some linger for many
            running.append((step + (1 if rng.random() < 0.7 else rng.randint(2, 12)), spec))
        done = [spec for at, spec in running if at <= step]
        running = [(at, spec) for at, spec in running if at > step]
        for spec in done:
            core.episode_finished(spec, EpisodeResult(_traj(spec.domain, float(rng.random() < 0.5)), None), Usage())
        groups = core.take(B)
        if groups is not None:
            assert len(groups) == B
            seen += [g.staleness for g in groups]
            assert all(t.policy_staleness == g.staleness for g in groups for t in g.trajectories)
            core.set_version(f"v{step}")
    assert len(seen) >= 8 * B
    assert max(seen) <= max_staleness
    if max_staleness == 0:  # synchronous RL: every sample from the current policy
        assert set(seen) == {0}
