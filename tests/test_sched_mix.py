"""Every trainer step is spread over the mix's families as the quotas are (not filled from one
family, alphabetically), seeded, and a resumed run draws the same steps."""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest

from posttrain.scheduling import AdaptiveConfig, DomainSpec, SchedulerConfig, SchedulerCore
from posttrain.scheduling.strata import stratified_order
from posttrain.scheduling.work import Usage
from posttrain.values.episode import EpisodeResult
from posttrain.values.trajectory import Trajectory

# the registry's family sizes at the time of writing (402 domains)
FAMILIES = {"code": 41, "docs": 86, "geometry": 43, "math": 54, "rg": 95, "terminal": 41, "text": 42}
GPS = 32


def names() -> list[str]:
    return [f"{f}.s{i % 5}.d{i:03d}" for f, n in FAMILIES.items() for i in range(n)]


def make_core(specs: list[DomainSpec], seed: int = 0) -> tuple[SchedulerCore, list[float]]:
    cfg = SchedulerConfig(group_size=2, tiers=("train",), trainer_tier="train", max_running=10**6,
                          groups_per_step=GPS, max_staleness=0, seed=seed,
                          adaptive=AdaptiveConfig(enabled=False))
    now = [0.0]
    return SchedulerCore(cfg, specs, clock=lambda: now[0]), now


def run_steps(core: SchedulerCore, now: list[float], steps: int, rng: random.Random) -> list[Counter]:
    """Synchronous steps: admit, finish every episode (in a shuffled order), take, update."""
    comps = []
    for _ in range(steps):
        running = []
        while (spec := core.next_episode()) is not None:
            running.append(spec)
        rng.shuffle(running)
        for spec in running:
            now[0] += 0.01
            traj = Trajectory(task_key="k", task_hash="h", domain=spec.domain, split="train",
                              policy_version="v", status="completed", reward=float(spec.member % 2))
            core.episode_finished(spec, EpisodeResult(traj, None), Usage())
        groups = core.take(GPS)
        assert groups is not None and len(groups) == GPS
        comps.append(Counter(g.domain for g in groups))
        core.set_version(f"step-{core.staleness.version + 1}")
    return comps


def family_errors(comps: list[Counter], weights: dict[str, float]) -> list[float]:
    """Per step, the largest |family share of the step - family quota|."""
    total = sum(weights.values())
    quota: Counter = Counter()
    for d, w in weights.items():
        quota[d.split(".")[0]] += w / total
    out = []
    for c in comps:
        fam: Counter = Counter()
        for d, k in c.items():
            fam[d.split(".")[0]] += k
        out.append(max(abs(fam[f] / GPS - q) for f, q in quota.items()))
    return out


def domain_mix_error(comps: list[Counter], weights: dict[str, float]) -> float:
    """benchmarks/breadth.py's step_mix_error: per domain the worst step, averaged."""
    total = sum(weights.values())
    return sum(max(abs(c[d] / GPS - w / total) for c in comps) for d, w in weights.items()) / len(weights)


@pytest.mark.parametrize("family_weights", [None, {"code": 2.0, "terminal": 3.0, "math": 0.5}])
def test_every_step_is_spread_over_the_families_as_the_quotas(family_weights) -> None:
    fw = family_weights or {}
    specs = [DomainSpec(n, weight=fw.get(n.split(".")[0], 1.0)) for n in names()]
    weights = {s.name: s.weight for s in specs}
    core, now = make_core(specs)
    comps = run_steps(core, now, 40, random.Random(1))
    errors = family_errors(comps, weights)
    # one seat of 32 is 0.031: no family is ever more than about a seat and a half off its quota
    assert max(errors) <= 0.05, errors
    assert all(len({d.split(".")[0] for d in c}) == len(FAMILIES) for c in comps)
    assert domain_mix_error(comps, weights) <= 0.05
    # and the quotas hold over the run: every domain served in proportion to its weight
    served = sum(comps, Counter())
    total = sum(weights.values())
    for d, w in weights.items():
        assert abs(served[d] - 40 * GPS * w / total) <= 1.0, d


def test_a_single_family_mix_still_spreads_over_its_subfamilies() -> None:
    specs = [DomainSpec(f"docs.{sub}.d{i:02d}") for sub in ("chart", "finance", "lookup", "page")
             for i in range(24)]
    core, now = make_core(specs)
    comps = run_steps(core, now, 12, random.Random(2))
    for c in comps:
        subs = Counter(d.split(".")[1] for d in c.elements())
        assert set(subs) == {"chart", "finance", "lookup", "page"}
        assert max(subs.values()) - min(subs.values()) <= 2, subs


def test_the_order_is_seeded_and_deterministic() -> None:
    ns = names()
    assert stratified_order(ns, seed=3) == stratified_order(list(reversed(ns)), seed=3)
    assert stratified_order(ns, seed=3) != stratified_order(ns, seed=4)
    assert sorted(stratified_order(ns, seed=3)) == sorted(ns)
    # a name that is also a prefix of others is its own stratum
    assert sorted(stratified_order(["code", "code.a", "code.b"])) == ["code", "code.a", "code.b"]
    with pytest.raises(ValueError, match="listed twice"):
        stratified_order(["a.b", "a.b"])

    def first_step(seed: int) -> set[str]:
        core, now = make_core([DomainSpec(n) for n in ns], seed=seed)
        return set(run_steps(core, now, 1, random.Random(0))[0])
    assert first_step(5) == first_step(5)
    assert first_step(5) != first_step(6)  # the seed rotates which domains take the first seats


def test_a_resumed_core_draws_the_same_steps() -> None:
    specs = [DomainSpec(n, weight=1.0 + (i % 3)) for i, n in enumerate(names())]
    core, now = make_core(specs)
    run_steps(core, now, 5, random.Random(3))
    state = json.loads(json.dumps(core.state_dict()))
    expected = run_steps(core, now, 6, random.Random(4))
    resumed, now2 = make_core(specs)
    resumed = SchedulerCore.from_state(state, resumed.config, specs, completed=set(),
                                       clock=lambda: now2[0])
    assert run_steps(resumed, now2, 6, random.Random(4)) == expected
