"""A group's bookkeeping, and the scheduler core's state and metrics as plain JSON-able dicts.

Saved state holds ages (seconds before the save) instead of clock readings, so it can be loaded
by another process whose monotonic clock started elsewhere. Trajectories are not in it: the store
holds finished groups; groups unfinished at save time are re-issued on load.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from posttrain.values.episode import EpisodeResult
from posttrain.scheduling.work import Group, Usage

if TYPE_CHECKING:
    from posttrain.scheduling.config import DomainSpec
    from posttrain.scheduling.core import SchedulerCore

STATE_FORMAT = 1


class DomainState:
    """One domain's counters in the core."""

    STATS = ("groups_ready", "groups_dropped", "samples", "cost", "sandbox_s", "gen_s", "tokens",
             "infra_errors", "retries", "signal_groups")
    __slots__ = ("spec", "next_index", "running", "queued", "est_cost", "waits") + STATS

    def __init__(self, spec: "DomainSpec") -> None:
        self.spec = spec
        self.next_index = 0
        """groups drawn so far: the next one is '<domain>#<next_index>'"""
        self.running = 0
        self.queued = 0
        """members of open groups neither running nor kept: waiting to launch or in backoff"""
        self.est_cost: float | None = None
        """running average of a group's cost (None before one completes)"""
        self.waits: deque[float] = deque(maxlen=1024)
        """latest queue waits (ready to launch -> launched) of its episodes"""
        for k in self.STATS:
            setattr(self, k, 0)

    def stats(self) -> dict[str, float]:
        return {k: getattr(self, k) for k in self.STATS}


@dataclass
class GroupState:
    gid: str
    domain: str
    tier: str
    index: int
    size: int
    task_seed: int
    version: int
    policy_version: str
    admitted_at: float
    est_cost: float
    seq: int = 0
    """admission order (restored groups get new numbers, ahead of new groups)"""
    status: str = "open"
    """open -> ready -> taken, or dropped"""
    members: list[EpisodeResult | None] = field(default_factory=list)
    attempts: list[int] = field(default_factory=list)
    retries: list[int] = field(default_factory=list)
    unlaunched: deque[int] = field(default_factory=deque)
    waiting: set[int] = field(default_factory=set)
    """members in retry backoff"""
    running: set[int] = field(default_factory=set)
    ready_since: dict[int, float] = field(default_factory=dict)
    usage: Usage = field(default_factory=Usage)
    completed_at: float = 0.0
    kept: int = 0
    """members holding a completed/truncated trajectory"""
    group: Group | None = None
    """the delivered form, built once when the group becomes ready"""

    def __post_init__(self) -> None:
        if not self.members:
            self.members = [None] * self.size
            self.attempts = [0] * self.size
            self.retries = [0] * self.size

    task: Any = None
    """the group's `Task`, resolved by the engine at its first launch (not saved: a resumed
    group's task is resolved again from its seed)"""

    def to_group(self, results: list[EpisodeResult]) -> Group:
        return Group(group_id=self.gid, domain=self.domain, tier=self.tier, task_seed=self.task_seed,
                     policy_version=self.policy_version, version=self.version,
                     results=results, usage=self.usage, admitted_at=self.admitted_at,
                     completed_at=self.completed_at)

    def launched(self, m: int) -> bool:
        """Whether member `m` has run (or is running) at its current attempt."""
        return m in self.running or self.members[m] is not None


def dump_state(core: "SchedulerCore") -> dict[str, Any]:
    now = core.clock()
    groups = []
    for tier in core.config.tiers:
        for g in core.open[tier].values():
            groups.append({
                "gid": g.gid, "domain": g.domain, "tier": g.tier, "index": g.index, "size": g.size,
                "task_seed": g.task_seed, "version": g.version, "policy_version": g.policy_version,
                "admitted_age": round(now - g.admitted_at, 6), "est_cost": g.est_cost,
                "status": g.status, "attempts": list(g.attempts), "retries": list(g.retries),
                "launched": [g.launched(m) for m in range(g.size)]})
    return {
        "format": STATE_FORMAT, "seed": core.config.seed,
        "staleness": core.staleness.state_dict(), "version_name": core.version_name,
        "fair": {t: q.state_dict() for t, q in core.fair.items()},
        "domains": {d: {"next_index": ds.next_index, "est_cost": ds.est_cost, "stats": ds.stats()}
                    for d, ds in core.dom.items()},
        "quarantine": core.quarantine.state_dict(), "signal": core.signal.state_dict(),
        "counters": dict(core.counters),
        "staleness_hist": {str(k): v for k, v in core.staleness_hist.items()},
        "admitted_trainer": core.admitted_trainer,
        "submitted": {t: list(q) for t, q in core.submitted.items()},
        "running_episodes": core.running_total, "groups": groups,
        "recovered": list(core.recovered), "dropped": [list(x) for x in core.dropped]}


def load_state(core: "SchedulerCore", state: dict[str, Any]) -> None:
    if state.get("format") != STATE_FORMAT:
        raise ValueError(f"scheduler state: format {state.get('format')!r} is not {STATE_FORMAT}")
    if state.get("seed") != core.config.seed:
        raise ValueError(f"scheduler state: saved with seed {state.get('seed')!r}, but "
                         f"SchedulerConfig.seed is {core.config.seed} (task seeds would differ)")
    now = core.clock()
    core.staleness.load_state_dict(state["staleness"])
    core.version_name = str(state["version_name"])
    for tier, fs in state["fair"].items():
        if tier in core.fair:
            core.fair[tier].load_state_dict(fs)
    known = core.specs
    for d, s in state["domains"].items():
        if d not in known:
            continue
        ds = core.dom[d]
        ds.next_index = int(s["next_index"])
        if s["est_cost"] is not None:
            ds.est_cost = float(s["est_cost"])
            core._est_sum += ds.est_cost
            core._est_n += 1
        for k, v in s["stats"].items():
            if k in DomainState.STATS:
                setattr(ds, k, v)
    core.quarantine.load_state_dict(state["quarantine"])
    core.signal.load_state_dict(state["signal"])
    core.counters.update({k: int(v) for k, v in state["counters"].items()})
    core.counters["episodes_abandoned"] += int(state["running_episodes"])
    core.staleness_hist = {int(k): int(v) for k, v in state["staleness_hist"].items()}
    core.admitted_trainer = int(state["admitted_trainer"])
    for tier, q in state["submitted"].items():
        for entry in q:  # [domain, group id or None]; a bare domain name before named groups
            d, gid = (entry, None) if isinstance(entry, str) else entry
            if d in known:
                core.submitted[tier].append((d, gid))
    core.recovered = list(state["recovered"])
    core.dropped.extend((str(a), str(b)) for a, b in state["dropped"])
    trainer = core.config.trainer_tier
    for s in state["groups"]:
        g = GroupState(gid=s["gid"], domain=s["domain"], tier=s["tier"], index=int(s["index"]),
                       size=int(s["size"]), task_seed=int(s["task_seed"]), version=int(s["version"]),
                       policy_version=str(s["policy_version"]), admitted_at=now - float(s["admitted_age"]),
                       est_cost=float(s["est_cost"]), seq=next(core._seq))
        was_ready = s["status"] == "ready"
        if g.domain not in known or g.tier not in core.fair:
            core.counters["groups_dropped"] += 1
            core.dropped.append((g.gid, "domain no longer configured"))
            if g.tier == trainer:
                core.staleness.accepted -= was_ready
                core.staleness.running -= not was_ready
            continue
        if core._is_completed(g.gid):
            core._recover(g, running=not was_ready)
            continue
        # Re-issue: every member runs again, a member that had run at attempt k now at k + 1
        # (a fresh sandbox, and never a duplicate of an attempt that may have been recorded).
        g.attempts = [a + bool(launched) for a, launched in zip(s["attempts"], s["launched"])]
        g.retries = [int(r) for r in s["retries"]]
        g.unlaunched.extend(range(g.size))
        g.ready_since = {m: now for m in range(g.size)}
        if g.tier == trainer and was_ready:
            core.staleness.accepted -= 1
            core.staleness.running += 1
        core.groups[g.gid] = g
        core.open[g.tier][g.gid] = g
        core.launchable[g.tier][g.gid] = g
        core.dom[g.domain].queued += g.size
    for d in known:
        core._update_block(d)
    for d in list(core.quarantine.quarantined):
        if d in known:
            core._quarantine(d)


def _pct(values: Any, q: float) -> float | None:
    return round(float(np.percentile(np.fromiter(values, float), q)), 6) if values else None


def core_metrics(core: "SchedulerCore", per_domain: bool = True) -> dict[str, Any]:
    c = dict(core.counters)
    c["lost"] = (c["episodes_launched"] - c["episodes_kept"] - c["episodes_infra_error"]
                 - c["episodes_discarded"] - c["episodes_abandoned"] - core.running_total)
    active_weight: dict[str, float] = {t: 0.0 for t in core.config.tiers}
    for name, spec in core.specs.items():
        if spec.continuous and core._allowed(name):
            active_weight[spec.tier] += core.fair[spec.tier].weight(name)
    domains, max_wait, all_waits = {}, 0.0, []
    for name, spec in core.specs.items():
        fair = core.fair[spec.tier]
        sample_share, cost_share = fair.shares(name)
        max_gap, current = fair.wait(name)
        allowed = core._allowed(name)
        if spec.continuous and allowed:
            max_wait = max(max_wait, max_gap, current)
        ds = core.dom[name]
        w = ds.waits
        all_waits.extend(w)
        st = ds.stats()
        eff = fair.weight(name)
        domains[name] = {
            "tier": spec.tier, "weight": spec.weight, "effective_weight": round(eff, 6),
            "quota": round(eff / active_weight[spec.tier], 6) if spec.continuous and allowed
            and active_weight[spec.tier] > 0 else 0.0,
            "sample_share": round(sample_share, 6), "cost_share": round(cost_share, 6),
            "running": ds.running, "queued": ds.queued,
            "queue_wait_p50_s": _pct(w, 50), "queue_wait_p99_s": _pct(w, 99),
            "max_service_gap_s": round(max_gap, 6), "current_wait_s": round(current, 6),
            "signal_share": core.signal.signal_share(name),
            "infra_error_rate": round(core.quarantine.rate(name), 4),
            "quarantined": name in core.quarantine.quarantined, "retired": name in core.signal.retired,
            **{k: (round(v, 6) if isinstance(v, float) else v) for k, v in st.items()}}
    hist = core.staleness_hist
    n_taken = sum(hist.values())
    return {
        "version": core.staleness.version, "version_name": core.version_name,
        "running_episodes": core.running_total,
        "ready_groups": {t: len(r) for t, r in core.ready.items()},
        "counters": c, "lost": c["lost"], "retries": c["retries"],
        "infra_errors": c["episodes_infra_error"],
        "queue_wait_p50_s": _pct(all_waits, 50), "queue_wait_p99_s": _pct(all_waits, 99),
        "max_wait_s": round(max_wait, 6),
        "quarantined": {d: dict(r) for d, r in core.quarantine.quarantined.items()},
        "retired": {d: dict(r) for d, r in core.signal.retired.items()},
        "staleness": {"max_staleness": core.config.max_staleness, "accepted": core.staleness.accepted,
                      "running": core.staleness.running, "capacity": core.staleness.capacity(),
                      "histogram": {str(k): v for k, v in sorted(hist.items())},
                      "max": max(hist) if hist else None,
                      "mean": round(sum(k * v for k, v in hist.items()) / n_taken, 4) if n_taken else None},
        **({"domains": domains} if per_domain else {})}
