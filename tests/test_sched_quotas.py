"""Quota arithmetic of the fair queue (samples and cost), caps, blocking and the starvation guard."""

from collections import Counter

import pytest

from posttrain.scheduling import DomainSpec, SchedulerConfig
from posttrain.scheduling.quotas import FairQueue, Window


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def serve(q: FairQueue, n: int, charge=lambda name: 1.0, clock: Clock | None = None) -> Counter:
    got = Counter()
    for _ in range(n):
        name = q.pick()
        assert name is not None
        amount = charge(name)
        q.charge(name, amount, samples=1, cost=amount)
        got[name] += 1
        if clock is not None:
            clock.t += 1.0
    return got


def test_weighted_shares_are_exact_to_one_group():
    q = FairQueue(window_s=1e9, starvation_s=None, clock=Clock())
    for name, w in (("a", 1), ("b", 2), ("c", 3), ("d", 6)):
        q.add(name, w)
    got = serve(q, 1200)
    for name, w in (("a", 1), ("b", 2), ("c", 3), ("d", 6)):
        assert abs(got[name] - 1200 * w / 12) <= 1


def test_cost_fair_share_gives_cheap_domains_more_groups():
    cost = {"cheap": 1.0, "mid": 4.0, "dear": 16.0}
    q = FairQueue(window_s=1e9, starvation_s=None, clock=Clock())
    for name in cost:
        q.add(name, 1.0)
    got = serve(q, 2100, charge=cost.__getitem__)
    spent = {n: got[n] * cost[n] for n in cost}
    total = sum(spent.values())
    for n in cost:  # equal cost shares, to within one dear group
        assert abs(spent[n] / total - 1 / 3) <= 16 / total
    assert got["cheap"] > 10 * got["dear"] > 0


def test_adjust_corrects_a_wrong_estimate():
    q = FairQueue(window_s=1e9, starvation_s=None, clock=Clock())
    q.add("a", 1.0)
    q.add("b", 1.0)
    # both are estimated at 1.0 per group, but "a" really costs 3.0: corrections catch up
    got = Counter()
    for _ in range(400):
        name = q.pick()
        q.charge(name, 1.0, 1, 1.0)
        if name == "a":
            q.adjust("a", 2.0, 2.0)
        got[name] += 1
    assert abs(got["b"] / got["a"] - 3.0) < 0.05


def test_sample_cap_is_soft_and_bounds_the_share():
    clock = Clock()
    q = FairQueue(window_s=1e9, starvation_s=None, clock=clock)
    q.add("big", 10.0, sample_cap=0.2)
    q.add("small", 1.0)
    got = serve(q, 500)
    assert got["big"] / 500 == pytest.approx(0.2, abs=0.02)
    q.block("small")  # alone, a capped domain still runs: caps never leave work undone
    assert q.pick() == "big"


def test_window_expires_usage():
    w = Window()
    w.add(0.0, 4, 2.0)
    w.add(5.0, 4, 1.0)
    w.expire(1.0)
    assert (w.samples, w.cost) == (4, 1.0)
    w.expire(10.0)
    assert (w.samples, w.cost) == (0, 0.0)


def test_unblocked_domain_gets_no_hoarded_credit():
    q = FairQueue(window_s=1e9, starvation_s=None, clock=Clock())
    q.add("a", 1.0)
    q.add("b", 1.0)
    q.block("b")
    serve(q, 100)  # only "a" runs meanwhile
    q.unblock("b")
    got = serve(q, 20)
    assert got["b"] == 10  # back to its share, not 100 groups of catch-up


def test_blocked_domains_are_never_picked_and_all_blocked_is_none():
    q = FairQueue(window_s=1e9, starvation_s=None, clock=Clock())
    q.add("a", 1.0)
    q.add("b", 1.0)
    q.block("a")
    assert set(serve(q, 10)) == {"b"}
    q.block("b")
    assert q.pick() is None


@pytest.mark.parametrize("share", [1.0, 0.1])
def test_starvation_guard_bounds_the_wait_under_an_adversarial_mix(share):
    # one domain of weight 1 among 50 of weight 1000: its fair turn comes every ~50,000 groups;
    # the guard serves it once it has waited 100 s (one group per simulated second) -- with or
    # without a budget: one service in 100 groups is well within a tenth of them
    clock = Clock()
    q = FairQueue(window_s=1e9, starvation_s=100.0, clock=clock, starvation_share=share)
    q.add("rare", 1.0)
    for i in range(50):
        q.add(f"hog{i}", 1000.0)
    got = serve(q, 1000, clock=clock)
    assert got["rare"] >= 9
    max_gap, current = q.wait("rare")
    assert max_gap <= 102 and current <= 101
    q2 = FairQueue(window_s=1e9, starvation_s=None, clock=Clock())
    q2.add("rare", 1.0)
    for i in range(50):
        q2.add(f"hog{i}", 1000.0)
    assert serve(q2, 1000)["rare"] == 1  # without the guard: only its first turn


HEAVY = [f"h{i}" for i in range(40)]
HEAVY_FAIR = 40 * 0.6 / (40 * 0.6 + 290 * 0.1)  # 0.45: the heavy domains' share by weight


def breadth_queue(clock: Clock, share: float) -> FairQueue:
    """A 330-domain run's tier after adaptive weights: the 40 `HEAVY` domains (a reward spread) at
    0.6, 290 at the floor 0.1; a 120 s starvation guard with budget `share`."""
    q = FairQueue(window_s=600.0, starvation_s=120.0, clock=clock, starvation_share=share)
    for name in HEAVY:
        q.add(name, 0.6)
    for i in range(290):
        q.add(f"f{i}", 0.1)
    return q


def test_the_guard_cannot_turn_the_weights_into_a_round_robin_where_its_bound_is_infeasible():
    """330 domains, 40 of weight 0.6 (adaptive weights: a reward spread) and 290 at the floor 0.1,
    served 32 groups per 55 s step (a synchronous run's pace): no domain can be served every 120 s,
    so every domain outwaits the guard. Unbudgeted, the guard serves the longest wait first for
    every group -- a round-robin that gave the weighted domains 2.8 groups each in 20 steps
    instead of 7; with its budget (a tenth of the groups) the weights decide the rest."""
    def run(share: float) -> tuple[float, FairQueue]:
        clock = Clock()
        q = breadth_queue(clock, share)
        got: Counter = Counter()
        for _ in range(20):
            got += serve(q, 32, charge=lambda name: 8.0)
            clock.t += 55.0
        return sum(got[h] for h in HEAVY) / 640, q

    fair = HEAVY_FAIR
    round_robin, q1 = run(1.0)
    budgeted, q2 = run(0.1)
    assert round_robin < 0.5 * fair  # the fault: weights overridden
    assert q1.guard_served > 0.5 * 640
    assert budgeted >= 0.85 * fair
    assert 0 < q2.guard_served <= 0.1 * 640 + 1
    again = FairQueue(window_s=600.0, starvation_s=120.0, clock=Clock(), starvation_share=0.1)
    for name in q2.names():
        again.add(name, q2.weight(name))
    again.load_state_dict(q2.state_dict())  # the budget survives a resume
    assert (again.guard_credit, again.guard_served) == (q2.guard_credit, q2.guard_served)
    with pytest.raises(ValueError, match="starvation_share"):
        FairQueue(window_s=1.0, starvation_s=1.0, clock=Clock(), starvation_share=0.0)
    with pytest.raises(ValueError, match="starvation_share"):
        SchedulerConfig(starvation_share=1.5)


def test_a_service_out_of_turn_does_not_move_the_virtual_time():
    """The guard serves a floor domain whose tag lies far ahead; if that moved the queue's virtual
    time, every domain coming back from a block (a sandboxed domain paused at its concurrency
    limit while its group runs) would be raised to that far tag and lose its turn: 40 weighted
    domains paused so got 0.22 of the groups against 0.44 by weight (in a 329-domain run, the
    sandboxed domains that the adaptive weights favoured got half their quota)."""
    heavy = set(HEAVY)
    clock = Clock()
    q = breadth_queue(clock, 0.1)
    got = 0
    for _ in range(20):
        paused = []
        for _ in range(32):
            name = q.pick()
            q.charge(name, 8.0, samples=8, cost=1.0)
            if name in heavy:
                got += 1
                q.block(name)
                paused.append(name)
        clock.t += 55.0  # a synchronous step: the paused groups run, then their domains return
        for name in paused:
            q.unblock(name)
    assert q.guard_served > 0  # the guard did serve out of turn
    assert got / 640 >= 0.9 * HEAVY_FAIR


def test_submitted_work_is_charged_out_of_turn():
    """Work submitted ahead of the fair share (charged with `in_turn=False`) moves neither the
    virtual time nor the guard's budget, even for the domain the guard last looked at."""
    clock = Clock()
    q = FairQueue(window_s=1e9, starvation_s=5.0, clock=clock, starvation_share=0.5)
    q.add("a", 1.0)
    q.add("b", 1.0)
    clock.t = 10.0
    assert q.pick() == "a"  # the guard's pick (both outwaited 5 s), only looked at
    for _ in range(3):
        q.charge("a", 4.0, samples=4, cost=1.0, in_turn=False)
    assert (q.vtime, q.guard_served) == (0.0, 0)
    q.charge("b", 4.0, samples=4, cost=1.0)  # in turn: b's start tag, 0
    assert q.vtime == 0.0 and q.pick() == "b"


def test_domain_spec_validation_names_field_and_value():
    with pytest.raises(ValueError, match=r"DomainSpec 'x'.weight must be > 0, got -1"):
        DomainSpec("x", weight=-1)
    with pytest.raises(ValueError, match=r"max_cost_share"):
        DomainSpec("x", max_cost_share=1.5)
    with pytest.raises(ValueError, match=r"SchedulerConfig.trainer_tier"):
        SchedulerConfig(tiers=("eval",), trainer_tier="train")
    with pytest.raises(ValueError, match=r"share_by"):
        SchedulerConfig(share_by="bananas")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"DomainSpec 'x'.max_tokens must be > 0 or None, got 0"):
        DomainSpec("x", max_tokens=0)


def test_domains_that_start_waiting_together_outwait_the_guard_in_rank_order():
    """Domains admitted in one pass read the clock microseconds apart, in alphabetical order;
    once they have all waited past `starvation_s`, the guard serves them in their rank
    (stratified) order, not in that order of admission -- which filled whole trainer steps from
    one family in a 330-domain run once its unserved domains passed the guard's 120 s."""

    class Ticking(Clock):
        def __call__(self) -> float:
            self.t += 1e-6  # every read a microsecond later, as a real clock
            return self.t

    clock = Ticking()
    q = FairQueue(window_s=1e9, starvation_s=120.0, clock=clock)
    names = [f"{fam}.{i}" for fam in ("code", "math", "text") for i in range(4)]  # alphabetical
    ranks = {n: i for i, n in enumerate(sorted(names, key=lambda n: (n.split(".")[1], n)))}
    for i, name in enumerate(names):  # tags in admission order: the guard must not follow them
        q.add(name, 1.0, rank=ranks[name], offset=i * 1e-3)
    assert q.pick() == "code.0"  # by tag, before anyone outwaits the guard
    clock.t += 500.0  # everyone has waited past the guard
    got = []
    for _ in range(len(names)):
        name = q.pick()
        got.append(name)
        q.charge(name, 1000.0, samples=1, cost=1)
    assert got == sorted(names, key=lambda n: ranks[n])  # code.0, math.0, text.0, code.1, ...
    assert [n.split(".")[0] for n in got[:3]] == ["code", "math", "text"]
