"""Dynamic sampling (`[rollout] signal_groups`): a step keeps taking groups until enough of them
carry a GRPO signal, bounded by `max_takes`, and a stalled scheduler ends the search."""

import asyncio
from types import SimpleNamespace

import pytest

from posttrain.pipeline.config import ConfigError, load_config
from posttrain.pipeline.mix import take_with_signal
from posttrain.scheduling import SchedulerStalled


class FakeScheduler:
    def __init__(self, signal: list[bool], stall_after: int | None = None):
        self.signal, self.taken, self.stall_after, self.calls = list(signal), 0, stall_after, 0

    async def take_more(self, n):
        return await self.take(n)

    async def take(self, n):
        self.calls += 1
        if self.stall_after is not None and self.calls > self.stall_after:
            raise SchedulerStalled("every domain retired")
        out = [SimpleNamespace(has_signal=s) for s in self.signal[self.taken:self.taken + n]]
        self.taken += len(out)
        return out


def take(sched, **rollout):
    return asyncio.run(take_with_signal(sched, SimpleNamespace(**({"groups_per_step": 2, "signal_groups": 0,
                                                                    "max_takes": 4} | rollout))))


def test_off_takes_once():
    groups, takes = take(FakeScheduler([False] * 10))
    assert len(groups) == 2 and takes == 1


def test_takes_until_enough_groups_have_signal():
    groups, takes = take(FakeScheduler([False, False, False, True, False, True, True]), signal_groups=2)
    assert takes == 3 and len(groups) == 6 and sum(g.has_signal for g in groups) == 2


def test_the_search_is_bounded_and_ends_on_an_empty_or_stalled_scheduler():
    groups, takes = take(FakeScheduler([False] * 20), signal_groups=3, max_takes=3)
    assert takes == 3 and len(groups) == 6
    groups, takes = take(FakeScheduler([False] * 3), signal_groups=3)
    assert takes == 2 and len(groups) == 3  # the third take came back empty
    groups, takes = take(FakeScheduler([False] * 20, stall_after=2), signal_groups=3)
    assert takes == 2 and len(groups) == 4


def test_config_fields_are_validated(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text("[rollout]\nsignal_groups = 4\nmax_takes = 3\n")
    cfg = load_config(path)
    assert cfg.rollout.signal_groups == 4 and cfg.rollout.max_takes == 3
    path.write_text("[rollout]\nmax_takes = 0\n")
    with pytest.raises(ConfigError, match="max_takes"):
        load_config(path)
