"""Quotas by generated tokens, and absolute budgets per domain (samples, tokens, sandbox-seconds)
after which a domain is retired for the run and reported as such."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from posttrain.pipeline.config import ConfigError, load_config
from posttrain.scheduling import AdaptiveConfig, DomainSpec, SchedulerConfig, SchedulerCore
from posttrain.scheduling.work import Usage
from posttrain.values.episode import EpisodeResult
from posttrain.values.trajectory import Trajectory


def make_core(specs, **cfg):
    config = SchedulerConfig(**{"group_size": 2, "tiers": ("train",), "trainer_tier": "train",
                                "max_running": 4, "groups_per_step": 1, "max_staleness": None,
                                "starvation_s": None, "adaptive": AdaptiveConfig(enabled=False), **cfg})
    now = [0.0]
    return SchedulerCore(config, specs, clock=lambda: now[0]), now


def drive(core, now, groups, usage_of):
    """Run `groups` groups one episode at a time (each ends before the next starts); the usage
    of an episode of domain d is `usage_of(d)`. Returns the groups taken per domain."""
    taken: Counter = Counter()
    while sum(taken.values()) < groups:
        spec = core.next_episode()
        if spec is None:
            break
        now[0] += 1.0
        traj = Trajectory(task_key="k", task_hash="h", domain=spec.domain, split="train",
                          policy_version="v", status="completed", reward=float(spec.member % 2))
        core.episode_finished(spec, EpisodeResult(traj, None), usage_of(spec.domain))
        for g in core.take_ready("train"):
            taken[g.domain] += 1
    return taken


def test_share_by_tokens_divides_generated_tokens_by_weight():
    tokens = {"long": 100, "short": 10, "mid": 40}
    specs = [DomainSpec("long"), DomainSpec("short"), DomainSpec("mid", weight=2.0)]
    core, now = make_core(specs, share_by="tokens")
    taken = drive(core, now, 600, lambda d: Usage(tokens=tokens[d]))
    spent = {d: core.dom[d].tokens for d in tokens}
    total = sum(spent.values())
    # token shares follow the weights (1:1:2) within a couple of groups' tokens
    for d, w in (("long", 0.25), ("short", 0.25), ("mid", 0.5)):
        assert abs(spent[d] / total - w) < 0.02, (d, spent)
    assert taken["short"] > 8 * taken["long"]  # so the cheap domain runs ~10x the groups
    # by samples the same workload is shared by groups instead
    core2, now2 = make_core(specs)
    taken2 = drive(core2, now2, 600, lambda d: Usage(tokens=tokens[d]))
    assert abs(taken2["short"] - taken2["long"]) <= 1


@pytest.mark.parametrize("budget, usage, spent_after", [
    ({"max_samples": 6}, Usage(), 3),              # 3 groups of 2
    ({"max_tokens": 50}, Usage(tokens=10), 3),      # 10 tokens a member: over 50 in the 3rd group
    ({"max_sandbox_s": 3.5}, Usage(sandbox_s=1.0), 2),
])
def test_a_domain_that_spent_its_budget_is_retired_and_reported(budget, usage, spent_after):
    specs = [DomainSpec("capped", **budget), DomainSpec("free")]
    core, now = make_core(specs)
    taken = drive(core, now, 40, lambda d: usage)
    assert taken["capped"] == spent_after and taken["free"] == 40 - spent_after
    field = next(iter(budget))
    m = core.metrics()
    assert field in m["exhausted"]["capped"] and m["domains"]["capped"]["exhausted"]
    assert m["domains"]["free"]["exhausted"] is None and m["counters"]["domains_exhausted"] == 1
    # a resumed run keeps it retired
    state = json.loads(json.dumps(core.state_dict()))
    resumed = SchedulerCore.from_state(state, core.config, specs, completed=set(), clock=lambda: now[0])
    assert drive(resumed, now, 10, lambda d: usage) == Counter(free=10)
    assert "capped" in resumed.metrics()["exhausted"]


def test_when_every_domain_spent_its_budget_the_trainer_is_told_why():
    specs = [DomainSpec("a", max_samples=2), DomainSpec("b", max_samples=2)]
    core, now = make_core(specs)
    assert drive(core, now, 10, lambda d: Usage()) == Counter(a=1, b=1)
    assert core.finished()
    reason = core.stalled_reason(1)
    assert reason is not None and "budget spent ['a', 'b']" in reason


def test_budgets_and_token_share_from_the_run_config(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text('[domains]\ntrain = ["math.add.d1", "math.add.d2"]\nheldout = []\n'
                    '[scheduler]\nshare_by = "tokens"\n'
                    '[scheduler.domains."math.add.d1"]\nmax_tokens = 5000\nmax_samples = 64\n')
    cfg = load_config(path)
    assert cfg.scheduler.share_by == "tokens"
    assert cfg.scheduler.domains["math.add.d1"].given() == {"max_tokens": 5000, "max_samples": 64}
    path.write_text(path.read_text().replace("max_tokens = 5000", "max_tokens = -5"))
    with pytest.raises(ConfigError, match=r"max_tokens.*-5"):
        load_config(path)
    path.write_text(path.read_text().replace('share_by = "tokens"', 'share_by = "words"'))
    with pytest.raises(ConfigError, match="share_by"):
        load_config(path)
