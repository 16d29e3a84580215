"""The core's decisions step by step: tiers and preemption, limits, retries, quarantine,
adaptive sampling, accounting (a fake clock, no event loop)."""

import pytest

from posttrain.scheduling import (
    AdaptiveConfig,
    DomainSpec,
    QuarantineConfig,
    RetryConfig,
    SchedulerConfig,
    SchedulerCore,
    Usage,
)
from posttrain.values.episode import EpisodeResult
from posttrain.values.trajectory import ErrorInfo, Trajectory
from posttrain.values.verdict import Verdict


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def ok(spec, reward=1.0) -> EpisodeResult:
    return EpisodeResult(Trajectory(task_key="k", task_hash="h", domain=spec.domain, split=spec.split,
                      policy_version=spec.policy_version, status="completed", reward=reward,
                      verdict=Verdict(passed=reward >= 1.0, score=reward)), None)


def fail(spec, where="sandbox") -> EpisodeResult:
    return EpisodeResult(Trajectory(task_key="k", task_hash="h", domain=spec.domain, split=spec.split,
                      policy_version=spec.policy_version, status="infra_error",
                      error=ErrorInfo("SandboxError", "died", where=where)), None)


def launch_all(core):
    out = []
    while (spec := core.next_episode()) is not None:
        out.append(spec)
    return out


def cfg(**kw) -> SchedulerConfig:
    base = dict(group_size=2, max_running=4, max_staleness=None, starvation_s=None,
                adaptive=AdaptiveConfig(enabled=False), retry=RetryConfig(backoff_s=1.0, jitter=0.0))
    base.update(kw)
    return SchedulerConfig(**base)


def test_higher_tier_takes_freed_slots_at_episode_boundaries():
    core = SchedulerCore(cfg(), [DomainSpec("train.a"), DomainSpec("eval.a", tier="eval", continuous=False),
                                 DomainSpec("bg.a", tier="background")], clock=Clock())
    first = launch_all(core)
    assert [s.tier for s in first] == ["train"] * 4  # training fills every slot
    core.submit("eval.a", 2)
    assert launch_all(core) == []  # running episodes are never interrupted
    core.episode_finished(first[0], ok(first[0]), Usage())
    nxt = launch_all(core)
    assert [s.domain for s in nxt] == ["eval.a"]  # the freed slot goes to the higher tier
    for spec in first[1:]:
        core.episode_finished(spec, ok(spec), Usage())
    assert [s.domain for s in launch_all(core)] == ["eval.a"] * 3
    assert "bg.a" not in {s.domain for s in launch_all(core)}  # training outranks background


def test_background_fills_slots_the_staleness_bound_leaves_idle():
    core = SchedulerCore(cfg(max_staleness=0, groups_per_step=1, group_size=2),
                         [DomainSpec("t"), DomainSpec("bg", tier="background")], clock=Clock())
    specs = launch_all(core)
    assert [s.domain for s in specs] == ["t", "t", "bg", "bg"]


def test_per_domain_concurrency_limit_and_limited_admission():
    core = SchedulerCore(cfg(max_running=10, group_size=4), [DomainSpec("heavy", max_concurrency=3),
                                                            DomainSpec("light")], clock=Clock())
    specs = launch_all(core)
    assert sum(s.domain == "heavy" for s in specs) == 3
    assert len(specs) == 10
    heavy = next(s for s in specs if s.domain == "heavy")
    core.episode_finished(heavy, ok(heavy), Usage())
    more = launch_all(core)
    assert [s.domain for s in more] == ["heavy"]  # its group's last member, within the limit


def test_retry_increments_attempt_after_backoff_then_drops_at_cap():
    clock = Clock()
    core = SchedulerCore(cfg(max_running=1, group_size=2, max_groups=1,
                             retry=RetryConfig(max_retries=2, backoff_s=1.0, jitter=0.0)),
                         [DomainSpec("a")], clock=clock)
    (s,) = launch_all(core)
    core.episode_finished(s, fail(s), Usage())
    assert core.next_retry_at() == 1.0
    (s2,) = launch_all(core)  # the other member goes while the failed one backs off
    assert s2.member != s.member
    core.episode_finished(s2, ok(s2), Usage())
    assert launch_all(core) == []  # still backing off, and the fixed workload is all admitted
    assert not core.finished()
    clock.t = 1.0
    specs = launch_all(core)
    retry = next(x for x in specs if x.group_id == s.group_id)
    assert (retry.member, retry.attempt) == (s.member, 1) and retry.sampling_seed != s.sampling_seed
    core.episode_finished(retry, fail(retry), Usage())
    assert core.next_retry_at() == pytest.approx(1.0 + 2.0)  # doubled
    clock.t = 3.0
    last = next(x for x in launch_all(core) if x.group_id == s.group_id)
    assert last.attempt == 2
    core.episode_finished(last, fail(last), Usage())
    assert s.group_id not in core.groups and core.finished()
    assert core.dropped[-1] == (s.group_id, "retries exhausted")
    m = core.metrics()
    assert m["counters"]["groups_dropped"] == 1 and m["retries"] == 2 and m["infra_errors"] == 3


def test_group_completes_only_when_every_member_is_kept():
    core = SchedulerCore(cfg(group_size=3, max_running=3), [DomainSpec("a")], clock=Clock(),)
    a, b, c = launch_all(core)
    core.episode_finished(a, ok(a), Usage())
    core.episode_finished(b, fail(b), Usage())
    core.episode_finished(c, ok(c, 0.0), Usage())
    assert core.take(1) is None
    core.clock.t = 10.0
    b2 = next(s for s in launch_all(core) if s.member == b.member)
    core.episode_finished(b2, ok(b2), Usage())
    (g,) = core.take(1)
    assert [t.attempt for t in g.trajectories] == [0, 1, 0]
    assert g.rewards == [1.0, 1.0, 0.0] and g.has_signal


def test_quarantine_on_error_rate_and_training_goes_on():
    q = QuarantineConfig(window=10, min_episodes=4, max_error_rate=0.5)
    core = SchedulerCore(cfg(max_running=8, group_size=2, quarantine=q, retry=RetryConfig(backoff_s=0.0)),
                         [DomainSpec("broken"), DomainSpec("fine")], clock=Clock())
    for _ in range(10):
        for spec in launch_all(core):
            core.episode_finished(spec, fail(spec) if spec.domain == "broken" else ok(spec), Usage())
        core.take_ready("train")
    m = core.metrics()
    assert set(m["quarantined"]) == {"broken"}
    report = m["quarantined"]["broken"]
    assert report["error_rate"] > 0.5 and "SandboxError" in report["last_error"]
    assert m["domains"]["broken"]["quota"] == 0.0 and m["domains"]["fine"]["quota"] == 1.0
    assert {s.domain for s in launch_all(core)} <= {"fine"}
    assert any(gid.startswith("broken#") and r == "domain quarantined" for gid, r in core.dropped)
    core.release_quarantine("broken")
    assert "broken" not in core.metrics()["quarantined"]


def test_policy_backend_errors_do_not_quarantine_a_domain():
    q = QuarantineConfig(window=4, min_episodes=2, max_error_rate=0.5)
    core = SchedulerCore(cfg(quarantine=q, retry=RetryConfig(backoff_s=0.0, max_retries=10)),
                         [DomainSpec("a")], clock=Clock())
    for _ in range(5):
        for spec in launch_all(core):
            core.episode_finished(spec, fail(spec, where="policy"), Usage())
    assert core.metrics()["quarantined"] == {}


def test_a_policy_backend_that_fails_everything_for_too_long_stalls_the_run():
    clock = Clock()
    core = SchedulerCore(cfg(retry=RetryConfig(backoff_s=0.0, max_retries=10, policy_outage_s=60.0)),
                         [DomainSpec("a")], clock=clock)
    for t in (0.0, 30.0):
        clock.t = t
        for spec in launch_all(core):
            core.episode_finished(spec, fail(spec, where="policy"), Usage())
    assert core.stalled_reason(1) is None  # failing for 30 s: still retrying
    spec = launch_all(core)[0]
    core.episode_finished(spec, ok(spec), Usage())  # one success resets the outage clock
    clock.t = 70.0
    for spec in launch_all(core):
        core.episode_finished(spec, fail(spec, where="policy"), Usage())
    assert core.stalled_reason(1) is None
    clock.t = 131.0
    for spec in launch_all(core):
        core.episode_finished(spec, fail(spec, where="policy"), Usage())
    reason = core.stalled_reason(1)
    assert reason and "61 s" in reason and "SandboxError: died" in reason
    # a domain's own infrastructure failures are the quarantine's business, not an outage
    core2 = SchedulerCore(cfg(retry=RetryConfig(backoff_s=0.0, max_retries=10, policy_outage_s=1.0)),
                          [DomainSpec("a")], clock=clock)
    for t in (200.0, 300.0):
        clock.t = t
        for spec in launch_all(core2):
            core2.episode_finished(spec, fail(spec), Usage())
    assert core2.stalled_reason(1) is None


def test_a_prompt_too_long_for_the_model_is_dropped_at_once_and_counts_against_its_domain():
    q = QuarantineConfig(window=4, min_episodes=2, max_error_rate=0.5)
    core = SchedulerCore(cfg(quarantine=q, retry=RetryConfig(backoff_s=0.0, max_retries=5)),
                         [DomainSpec("long"), DomainSpec("short")], clock=Clock())
    for _ in range(3):
        for spec in launch_all(core):
            core.episode_finished(spec, fail(spec, where="context") if spec.domain == "long" else ok(spec),
                                  Usage())
        core.take_ready("train")
    m = core.metrics()
    assert m["retries"] == 0 and "long" in m["quarantined"]  # no retry: it cannot help
    assert any(r == "the prompt does not fit the model's context" for _, r in core.dropped)
    assert {s.domain for s in launch_all(core)} <= {"short"}


def test_adaptive_downweights_no_signal_and_retires_saturated():
    ad = AdaptiveConfig(enabled=True, window=4, min_groups=2, floor=0.25, retire_after=3)
    core = SchedulerCore(cfg(max_running=8, group_size=2, adaptive=ad),
                         [DomainSpec("easy"), DomainSpec("hard"), DomainSpec("learnable")], clock=Clock())
    for _ in range(6):
        for spec in launch_all(core):
            reward = {"easy": 1.0, "hard": 0.0, "learnable": float(spec.member % 2)}[spec.domain]
            core.episode_finished(spec, ok(spec, reward), Usage())
        core.take_ready("train")
    m = core.metrics()
    assert "easy" in m["retired"] and "hard" not in m["retired"]  # all-fail: never retired
    assert m["domains"]["hard"]["effective_weight"] == 0.25  # floored: down-weighted, not starved
    assert m["domains"]["learnable"]["effective_weight"] == 1.0
    assert m["domains"]["hard"]["signal_share"] == 0.0
    assert {s.domain for s in launch_all(core)} <= {"hard", "learnable"}


def test_submitted_work_of_a_quarantined_domain_is_dropped_and_counted():
    core = SchedulerCore(cfg(), [DomainSpec("e", tier="eval", continuous=False), DomainSpec("t")],
                         clock=Clock())
    core.quarantine.quarantined["e"] = {"why": "test"}
    core.submit("e", 3)
    assert {s.domain for s in launch_all(core)} == {"t"}
    assert core.counters["submitted_dropped"] == 3
    with pytest.raises(KeyError, match="unknown domain"):
        core.submit("nope")


def test_accounting_loses_nothing_and_rejects_bad_domain_lists():
    core = SchedulerCore(cfg(max_running=6, group_size=3, retry=RetryConfig(backoff_s=0.0, max_retries=0)),
                         [DomainSpec("a"), DomainSpec("b")], clock=Clock())
    for i in range(20):
        for j, spec in enumerate(launch_all(core)):
            core.episode_finished(spec, fail(spec) if (i + j) % 7 == 0 else ok(spec), Usage(sandbox_s=1.0))
    m = core.metrics()
    c = m["counters"]
    assert m["lost"] == 0
    assert c["episodes_launched"] == c["episodes_kept"] + c["episodes_infra_error"] + c["episodes_discarded"]
    assert c["episodes_discarded"] > 0  # members that finished after their group was dropped
    with pytest.raises(ValueError, match="listed twice"):
        SchedulerCore(cfg(), [DomainSpec("a"), DomainSpec("a")])
    with pytest.raises(ValueError, match="tier"):
        SchedulerCore(cfg(), [DomainSpec("a", tier="nope")])


def test_no_domain_starves_under_an_adversarial_cost_mix():
    # cost mode: "whale" costs 10,000x a normal group and has a tiny weight, "limited" is held to
    # one episode at a time, 30 cheap domains compete; every domain is still served, and the
    # longest wait stays under the starvation bound (plus one episode's duration)
    clock = Clock()
    specs = [DomainSpec("whale", weight=0.01), DomainSpec("limited", max_concurrency=1)]
    specs += [DomainSpec(f"cheap{i}", weight=5.0) for i in range(30)]
    core = SchedulerCore(cfg(max_running=8, group_size=2, share_by="cost", starvation_s=50.0), specs,
                         clock=clock)
    core.worker_slots = 1
    cost = {s.name: 1.0 for s in specs} | {"whale": 10_000.0}
    served = {s.name: 0 for s in specs}
    for _ in range(2000):
        for spec in launch_all(core):
            served[spec.domain] += 1
            clock.t += 0.1
            core.episode_finished(spec, ok(spec), Usage(sandbox_s=cost[spec.domain]))
        core.take_ready("train")
    assert all(n > 0 for n in served.values())
    assert served["whale"] >= 4  # the guard's turns; its fair share alone would be ~1 group
    m = core.metrics()
    assert m["max_wait_s"] <= 50.0 + 2.0
    assert all(d["max_service_gap_s"] <= 52.0 for d in m["domains"].values())


def test_a_seed_prefix_gives_exactly_derive_seeds_seeds():
    from posttrain.scheduling.work import SeedPrefix, derive_seed

    for seed, domain in [(0, "math.arith"), (1234, "text.äöü#x"), (-7, "")]:
        prefix = SeedPrefix(seed, domain)
        for index in (0, 1, 17, 10**9):
            assert prefix(index, "task") == derive_seed(seed, domain, index, "task")
    with pytest.raises(ValueError, match="at least one"):
        SeedPrefix()


def test_submitted_work_does_not_cost_a_paused_domain_its_turn():
    """Groups submitted ahead of the fair share (interactive requests to the training tier) push
    their domain's tag far ahead; if those services moved the tier's virtual time, a domain back
    from its concurrency-limit pause would be raised to that tag and lose its turns to the others."""
    clock = Clock()
    core = SchedulerCore(cfg(max_running=2, group_size=2),
                         [DomainSpec("a", max_concurrency=2), DomainSpec("b"), DomainSpec("c")],
                         clock=clock)
    core.submit("c", 10)

    def one_group() -> str:
        specs = launch_all(core)
        assert len({s.group_id for s in specs}) == 1
        for spec in specs:
            core.episode_finished(spec, ok(spec), Usage())
        return specs[0].domain

    assert [one_group() for _ in range(10)] == ["c"] * 10
    served = [one_group() for _ in range(10)]
    assert served.count("a") == served.count("b") == 5  # a is paused during each of its groups
