"""Which domain of a tier goes next: weighted fair queueing over samples or cost, with caps.

This is deficit round-robin done with a heap: each domain carries a virtual time (its *finish
tag*, the charge it has received divided by its weight); the next group goes to the eligible
domain with the smallest tag, which is then charged `amount / weight` (start-time fair queueing,
Goyal et al. 1996). Like DRR, a backlogged domain's service never falls behind its weighted share
by more than one charge; unlike DRR's round scan, a decision costs O(log n) heap operations, so
it stays cheap with thousands of domains. In cost mode the charge is an *estimate* made at
admission and corrected by the measured cost at completion (`adjust`), as DRFQ does for packets
whose processing time is known only afterwards.

A domain that stops being eligible (at its concurrency limit, quarantined, retired) is taken out
(`block`); when it comes back (`unblock`) its tag is raised to the queue's virtual time, so it
does not return with a hoard of credit and burst (it is not owed service for time it could not
use). On top of the fair share:

* caps: a domain over its share cap (samples or cost, over the sliding window) is passed over
  while an uncapped domain of the tier can go; caps are soft, never leaving work undone;
* starvation guard: an eligible domain unserved for `starvation_s` goes next whatever its tag,
  within a budget: the guard's services take at most `starvation_share` of the tier's groups
  (a token bucket of one service, refilled by `starvation_share` per group charged). Without the
  budget the guard's bound is a promise the queue cannot keep once the domains outnumber what it
  serves in `starvation_s` (330 domains, ~0.6 groups a second, a 120 s bound): every domain then
  outwaits the bound, and the guard, serving the longest wait first, turns the weights into a
  round-robin -- which is what a 329-domain run did to its adaptive weights (its favoured
  domains got 2.3 groups each in 20 steps against the 5.8 their weights asked for; simulated at
  its shape, 2.8 against 7.0, `tests/test_sched_quotas.py`).
  With the budget the bound holds where it is feasible and the weights govern the rest. A
  service out of turn does not move the queue's virtual time (see `charge`).

Which domains share a trainer step is the order of service within a round: domains start at
phases spread over one charge and break equal tags by a rank, both from the tier's order
stratified by family (`posttrain.scheduling.strata`), so that a step is spread over the families
as the mix is. The phases hold while weights are equal within a family; with weights that differ
domain by domain (adaptive sampling) a step's family shares are off by a few groups.

What this does not do: guess how long a task of a domain will take before any has run (the cost
estimate starts at the mean of all domains), or split groups across domains.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from collections.abc import Callable
from typing import Any


class Window:
    """Sums of samples and cost over the last `window_s` seconds (events expire as time passes)."""

    __slots__ = ("events", "samples", "cost")

    def __init__(self) -> None:
        self.events: deque[tuple[float, float, float]] = deque()
        self.samples = 0.0
        self.cost = 0.0

    def add(self, t: float, samples: float, cost: float) -> None:
        self.events.append((t, samples, cost))
        self.samples += samples
        self.cost += cost

    def expire(self, horizon: float) -> None:
        events = self.events
        while events and events[0][0] < horizon:
            _, s, c = events.popleft()
            self.samples -= s
            self.cost -= c
        if not events:  # clear the float drift of many additions and subtractions
            self.samples = self.cost = 0.0

    def to_state(self, now: float) -> list[list[float]]:
        return [[round(now - t, 6), s, c] for t, s, c in self.events]

    def load_state(self, rows: list, now: float) -> None:
        self.events.clear()
        self.samples = self.cost = 0.0
        for age, s, c in rows:
            self.add(now - float(age), float(s), float(c))


class _Domain:
    __slots__ = ("name", "weight", "rank", "sample_cap", "cost_cap", "vtime", "since", "blocked",
                 "capped", "ventry", "aentry", "window", "max_gap", "served")

    def __init__(self, name: str, weight: float, rank: int, sample_cap: float | None,
                 cost_cap: float | None, vtime: float, now: float) -> None:
        self.name, self.weight = name, weight
        self.rank = rank
        """breaks ties of tags (and of waits): the tier's stratified order (`strata`)"""
        self.sample_cap, self.cost_cap = sample_cap, cost_cap
        self.vtime = vtime
        self.since = now
        """when this domain last became eligible-and-waiting (admission, unblock, start)"""
        self.blocked = False
        self.capped = False
        """set aside over its share cap (out of the heap, in FairQueue._capped)"""
        self.ventry: list | None = None
        self.aentry: list | None = None
        self.window = Window()
        self.max_gap = 0.0
        self.served = 0


class FairQueue:
    """The fair-share selector of one tier."""

    def __init__(self, *, window_s: float, starvation_s: float | None,
                 clock: Callable[[], float], starvation_share: float = 1.0) -> None:
        if not 0 < starvation_share <= 1:
            raise ValueError(f"starvation_share must be in (0, 1], got {starvation_share}")
        self.window_s = window_s
        self.starvation_s = starvation_s
        self.starvation_share = starvation_share
        self.guard_credit = 1.0
        """the guard's bucket: it may serve while this is >= 1; a service spends 1, every group
        charged adds `starvation_share` (at most 1 held: no bursts after a quiet spell)"""
        self.guard_served = 0
        """groups the starvation guard gave out of their fair-share turn"""
        self._guard_pick: str | None = None
        self.clock = clock
        self.vtime = 0.0
        """the queue's virtual time: the start tag of the last domain served in tag order"""
        self.total = Window()
        self._domains: dict[str, _Domain] = {}
        self._vheap: list[list] = []
        self._aheap: list[list] = []
        self._capped: deque[str] = deque()
        self._seq = itertools.count()
        self._wait_tick = min(1.0, starvation_s / 10) if starvation_s else 1.0
        """waits that began within one tick of each other count as equally long (see `_push`)"""

    # -- membership -------------------------------------------------------------------
    def add(self, name: str, weight: float, *, sample_cap: float | None = None,
            cost_cap: float | None = None, rank: int | None = None, offset: float = 0.0) -> None:
        """`rank`: the domain's place among those whose tags tie (lowest first); None: after
        every domain added so far. `offset` (>= 0, under one charge of the domain) starts its tag
        that far ahead of the queue's virtual time: a phase that spreads the services of domains
        of equal weight evenly over each round instead of bunching them at the same tag."""
        if name in self._domains:
            raise ValueError(f"domain {name!r} is already in this tier")
        if weight <= 0:
            raise ValueError(f"domain {name!r}: weight must be > 0, got {weight}")
        rank = len(self._domains) if rank is None else rank
        if offset < 0:
            raise ValueError(f"domain {name!r}: offset must be >= 0, got {offset}")
        d = _Domain(name, weight, rank, sample_cap, cost_cap, self.vtime + offset, self.clock())
        self._domains[name] = d
        self._push(d)

    def __contains__(self, name: str) -> bool:
        return name in self._domains

    def names(self) -> list[str]:
        return list(self._domains)

    def set_weight(self, name: str, weight: float) -> None:
        if weight <= 0:
            raise ValueError(f"domain {name!r}: weight must be > 0, got {weight}")
        self._domains[name].weight = weight

    def weight(self, name: str) -> float:
        return self._domains[name].weight

    def block(self, name: str) -> None:
        d = self._domains[name]
        if not d.blocked:
            d.blocked = True
            d.ventry = d.aentry = None  # their heap entries become stale

    def unblock(self, name: str) -> None:
        d = self._domains[name]
        if d.blocked:
            d.blocked = False
            d.capped = False  # re-checked at the next pick like any heap entry
            d.vtime = max(d.vtime, self.vtime)
            d.since = self.clock()
            self._push(d)

    def is_blocked(self, name: str) -> bool:
        return self._domains[name].blocked

    # -- decisions --------------------------------------------------------------------
    def pick(self) -> str | None:
        """The domain that should get the next group, or None if every domain is blocked.
        Does not charge it: call `charge` when the group is admitted."""
        now = self.clock()
        self._guard_pick = None
        if self.starvation_s is not None and self.guard_credit >= 1.0:
            heap = self._aheap
            while heap and heap[0] is not self._domains[heap[0][-1]].aentry:
                heapq.heappop(heap)
            if heap and now - self._domains[heap[0][-1]].since > self.starvation_s:
                self._guard_pick = heap[0][-1]
                return self._guard_pick
        self._recheck_capped(now)
        heap = self._vheap
        while heap:
            entry = heap[0]
            d = self._domains[entry[-1]]
            if entry is not d.ventry:
                heapq.heappop(heap)
                continue
            if self._over_cap(d, now):
                # Out of the heap until a re-check finds it under its cap (each pick re-checks a
                # couple): a decision never rescans every capped domain.
                heapq.heappop(heap)
                d.ventry, d.capped = None, True
                self._capped.append(d.name)
                continue
            return d.name
        # Caps are soft: with no uncapped domain able to go, the least-served capped one goes.
        capped = [self._domains[n] for n in self._capped]
        capped = [d for d in capped if d.capped and not d.blocked]
        return min(capped, key=lambda d: d.vtime).name if capped else None

    def _recheck_capped(self, now: float, n: int = 2) -> None:
        for _ in range(min(n, len(self._capped))):
            d = self._domains[self._capped.popleft()]
            if not d.capped or d.blocked:
                continue  # unblocked (and pushed) since, or blocked: `unblock` pushes it
            if self._over_cap(d, now):
                self._capped.append(d.name)
            else:
                d.capped = False
                self._push(d)

    def charge(self, name: str, amount: float, samples: float, cost: float, *,
               in_turn: bool = True) -> None:
        """`name` was given a group: advance its tag by `amount / weight` and count the group's
        (estimated) samples and cost in the windows. `in_turn=False`: the group was not this
        queue's pick (work submitted ahead of the fair share) -- charged, but out of turn."""
        d = self._domains[name]
        now = self.clock()
        if not in_turn:
            pass  # submitted work: neither the guard's service nor a turn in tag order
        elif name == self._guard_pick:  # the guard's service (not a pick that was only a look)
            self.guard_credit -= 1.0
            self.guard_served += 1
            self._guard_pick = None
        else:
            # The virtual time is the start tag of the latest service *in tag order*: a service
            # out of turn (the guard's or submitted work's, whose domain's tag may lie far ahead)
            # must not move it, or every domain that comes back from a block is raised to that
            # far tag and loses its turn -- in a 329-domain run the sandboxed domains, paused at
            # their concurrency limit during each of their groups, got half their quota so.
            self.vtime = max(self.vtime, d.vtime)
        self.guard_credit = min(1.0, self.guard_credit + self.starvation_share)
        d.vtime += amount / d.weight
        d.max_gap = max(d.max_gap, now - d.since)
        d.since = now
        d.served += 1
        d.capped = False
        self.record(name, samples, cost, now)
        if not d.blocked:
            self._push(d)

    def adjust(self, name: str, amount: float, cost: float) -> None:
        """Correct a domain's tag and windowed cost once the real cost of a group is known."""
        d = self._domains[name]
        d.vtime += amount / d.weight
        self.record(name, 0.0, cost, self.clock())
        if not d.blocked and not d.capped and amount != 0.0:
            self._push(d)

    def record(self, name: str, samples: float, cost: float, now: float | None = None) -> None:
        now = self.clock() if now is None else now
        self._domains[name].window.add(now, samples, cost)
        self.total.add(now, samples, cost)

    # -- views ------------------------------------------------------------------------
    def shares(self, name: str) -> tuple[float, float]:
        """(sample share, cost share) of the tier over the sliding window."""
        d = self._domains[name]
        self._expire(self.clock(), d)
        w = d.window
        return (w.samples / self.total.samples if self.total.samples > 0 else 0.0,
                w.cost / self.total.cost if self.total.cost > 0 else 0.0)

    def window_sums(self, name: str) -> tuple[float, float]:
        d = self._domains[name]
        self._expire(self.clock(), d)
        return d.window.samples, d.window.cost

    def wait(self, name: str) -> tuple[float, float]:
        """(longest gap seen between becoming eligible and being served, current wait if eligible)."""
        d = self._domains[name]
        current = 0.0 if d.blocked else self.clock() - d.since
        return d.max_gap, current

    def tag(self, name: str) -> float:
        return self._domains[name].vtime

    # -- internals --------------------------------------------------------------------
    def _push(self, d: _Domain) -> None:
        # Equal tags go in rank order, not push order: push order is the order domains were added
        # (alphabetical) or last served, which would fill a whole step from one family.
        seq = next(self._seq)
        d.ventry = [d.vtime, d.rank, seq, d.name]
        heapq.heappush(self._vheap, d.ventry)
        # Waits that began within one tick of each other tie, and go in rank order too: the
        # domains admitted (or unblocked) in one pass read the clock microseconds apart, in
        # alphabetical order, and once they all outwait `starvation_s` that order would again
        # fill whole steps from one family.
        d.aentry = [math.floor(d.since / self._wait_tick), d.rank, seq, d.name]
        heapq.heappush(self._aheap, d.aentry)

    def _over_cap(self, d: _Domain, now: float) -> bool:
        if d.sample_cap is None and d.cost_cap is None:
            return False
        self._expire(now, d)
        if d.sample_cap is not None and self.total.samples > 0 \
                and d.window.samples / self.total.samples >= d.sample_cap:
            return True
        return d.cost_cap is not None and self.total.cost > 0 \
            and d.window.cost / self.total.cost >= d.cost_cap

    def _expire(self, now: float, d: _Domain | None = None) -> None:
        """Drop events older than the window from the tier total and (only) from `d`'s window:
        per-domain windows expire lazily when looked at, so a decision never scans all domains."""
        horizon = now - self.window_s
        self.total.expire(horizon)
        if d is not None:
            d.window.expire(horizon)

    # -- state ------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        now = self.clock()
        return {"vtime": self.vtime, "guard_credit": self.guard_credit, "guard_served": self.guard_served,
                "domains": {
            n: {"vtime": d.vtime, "since_age": round(now - d.since, 6), "max_gap": d.max_gap,
                "served": d.served, "window": d.window.to_state(now)}
            for n, d in self._domains.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        now = self.clock()
        self.vtime = float(state["vtime"])
        self.guard_credit = float(state.get("guard_credit", 1.0))  # absent before the guard's budget
        self.guard_served = int(state.get("guard_served", 0))
        self.total = Window()
        for name, s in state["domains"].items():
            if name not in self._domains:
                continue  # a domain no longer configured: its history no longer matters
            d = self._domains[name]
            d.vtime, d.since = float(s["vtime"]), now - float(s["since_age"])
            d.max_gap, d.served = float(s["max_gap"]), int(s["served"])
            d.window.load_state(s["window"], now)
            for t, smp, c in d.window.events:
                self.total.add(t, smp, c)
            if not d.blocked:
                self._push(d)
        self.total.events = deque(sorted(self.total.events))
