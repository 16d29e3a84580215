"""The base evaluation as the adaptive weights' prior (`[scheduler.adaptive] prior_groups`): the
expected share of groups with a reward spread, how real groups push it out, and the first
admissions of a scheduler seeded with it."""

from types import SimpleNamespace

import pytest

from posttrain.pipeline.mix import signal_prior
from posttrain.scheduling import AdaptiveConfig, DomainSpec, RetryConfig, SchedulerConfig, SchedulerCore
from posttrain.scheduling.health import SignalTracker, expected_signal


def test_expected_signal_is_the_chance_that_a_group_is_neither_all_pass_nor_all_fail():
    assert expected_signal([(0, 8), (0, 8)], 8) == 0.0
    assert expected_signal([(8, 8)], 8) == 0.0
    assert expected_signal([(1, 2)], 2) == pytest.approx(0.5)  # 1 - 1/4 - 1/4
    assert expected_signal([(4, 8), (0, 8)], 8) == pytest.approx((1 - 2 * 0.5 ** 8) / 2)
    assert expected_signal([(0, 0)], 8) is None and expected_signal([], 8) is None


def test_the_prior_fills_the_window_until_real_groups_push_it_out():
    t = SignalTracker(AdaptiveConfig(window=4, min_groups=1, floor=0.1, prior_groups=3))
    t.set_prior({"dead": 0.0, "live": 0.6})
    assert t.multiplier("dead") == 0.1 and t.multiplier("live") == pytest.approx(0.6)
    assert t.multiplier("other") == 1.0  # no prior, no group yet
    t.record("dead", True, False)  # one real group with signal + 3 prior groups of 0
    assert t.multiplier("dead") == pytest.approx(0.25)
    t.record("dead", True, False)  # 2 real + the prior's 2 remaining slots
    assert t.multiplier("dead") == pytest.approx(0.5)
    for _ in range(2):
        t.record("dead", True, False)
    assert t.multiplier("dead") == 1.0  # the window holds only real groups now
    assert "prior" not in t.state_dict()  # an input, given again on resume
    off = SignalTracker(AdaptiveConfig(enabled=False, prior_groups=3))
    off.set_prior({"dead": 0.0})
    assert off.multiplier("dead") == 1.0
    with pytest.raises(ValueError, match="prior_groups"):
        AdaptiveConfig(window=4, prior_groups=5)


def _eval(counts: dict[str, list[tuple[int, int]]]):
    def record(domain, passed, n):
        samples = {j: SimpleNamespace(scored=True, passed=j < passed) for j in range(n)}
        return SimpleNamespace(domain=domain, by_index=lambda s=samples: s)
    return SimpleNamespace(records=[record(d, c, n) for d, tasks in counts.items() for c, n in tasks])


def test_signal_prior_reads_each_tasks_pass_rate_from_the_base_evaluation():
    before = _eval({"a": [(4, 8), (0, 8)], "b": [(0, 8)], "held": [(4, 8)]})
    prior = signal_prior(before, [DomainSpec("a"), DomainSpec("b", group_size=8)], 8)
    assert prior == pytest.approx({"a": (1 - 2 * 0.5 ** 8) / 2, "b": 0.0})  # held-out: not trained


def _first_admissions(prior_groups: int, n: int) -> list[str]:
    ad = AdaptiveConfig(window=4, min_groups=1, floor=0.1, prior_groups=prior_groups)
    config = SchedulerConfig(group_size=1, max_running=n, max_staleness=None, starvation_s=None, adaptive=ad,
                             retry=RetryConfig(backoff_s=1.0, jitter=0.0))
    names = ["live"] + [f"dead{i}" for i in range(9)]
    prior = {"live": 0.9, **{n: 0.0 for n in names[1:]}, "unknown": 1.0}
    core = SchedulerCore(config, [DomainSpec(n) for n in names], clock=lambda: 0.0,
                         signal_prior=prior if prior_groups else None)
    out = []
    while (spec := core.next_episode()) is not None:
        out.append(spec.domain)
    return out


def test_a_seeded_scheduler_gives_the_domains_with_signal_their_share_from_the_first_group():
    # without a prior the first round serves every domain once, whatever their signal
    assert _first_admissions(0, 10).count("live") == 1
    # weights 0.9 against nine at the floor (0.1): half the groups from the first round on,
    # the floor's domains spread over the rounds instead of all taking the first pass
    first = _first_admissions(4, 10)
    assert first.count("live") >= 4
    many = _first_admissions(4, 40)
    assert 18 <= many.count("live") <= 22
    assert all(f"dead{i}" in many for i in range(9))  # the floor keeps every domain
