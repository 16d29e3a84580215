"""The scheduler core's state: per-domain and per-group bookkeeping, and `CoreState`, the data
the core decides over, with its save/load as plain JSON-able dicts and its metrics.

`CoreState` holds data and reads it; every decision (admit, launch, retry, drop, recover) is
`SchedulerCore`'s, which builds on it. The dependency runs one way: the core imports this
module, never the reverse.

Saved state holds ages (seconds before the save) instead of clock readings, so it can be loaded
by another process whose monotonic clock started elsewhere. Trajectories are not in it: the store
holds finished groups; groups unfinished at save time are re-issued on load.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict, deque
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from posttrain.scheduling.config import DomainSpec, SchedulerConfig
from posttrain.scheduling.health import Quarantine, SignalTracker
from posttrain.scheduling.quotas import FairQueue
from posttrain.scheduling.staleness import StalenessController
from posttrain.scheduling.strata import stratified_ranks
from posttrain.scheduling.work import Group, SeedPrefix, Usage
from posttrain.values.episode import EpisodeResult

Completed = Callable[[str], bool] | Collection[str]
"""group ids already stored: a set, or a predicate over group ids"""

STATE_FORMAT = 1


class DomainState:
    """One domain's counters in the core."""

    STATS = ("groups_ready", "groups_dropped", "samples", "cost", "sandbox_s", "gen_s", "tokens",
             "infra_errors", "retries", "signal_groups")
    groups_ready: int
    groups_dropped: int
    samples: int
    cost: float
    sandbox_s: float
    gen_s: float
    tokens: int
    infra_errors: int
    retries: int
    signal_groups: int
    __slots__ = ("spec", "next_index", "running", "queued", "est_cost", "est_tokens", "waits",
                 "budgeted", "task_seed") + STATS

    def __init__(self, spec: DomainSpec, seed: int) -> None:
        self.spec = spec
        self.budgeted = (spec.max_samples is not None or spec.max_tokens is not None
                         or spec.max_sandbox_s is not None)
        """whether the domain has an absolute budget to check after each episode"""
        self.task_seed = SeedPrefix(seed, spec.name)
        """its groups' task seeds by index: `derive_seed(run seed, domain, index, 'task')`"""
        self.next_index = 0
        """groups drawn so far: the next one is '<domain>#<next_index>'"""
        self.running = 0
        self.queued = 0
        """members of open groups neither running nor kept: waiting to launch or in backoff"""
        self.est_cost: float | None = None
        """running average of a group's cost (None before one completes)"""
        self.est_tokens: float | None = None
        """running average of a group's generated tokens (None before one completes)"""
        self.waits: deque[float] = deque(maxlen=1024)
        """latest queue waits (ready to launch -> launched) of its episodes"""
        for k in self.STATS:
            setattr(self, k, 0)

    def stats(self) -> dict[str, float]:
        return {k: getattr(self, k) for k in self.STATS}


@dataclass(slots=True)  # one per group: no per-instance dict to build, fill and scan
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
    est_tokens: float = 0.0
    """the tokens it was charged at admission (`share_by = 'tokens'`), corrected at completion"""
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



class CoreState:
    """The data the scheduler core decides over, its saved form and its metrics."""

    def __init__(self, config: SchedulerConfig, domains: Sequence[DomainSpec], *,
                 clock: Callable[[], float], completed: Completed | None,
                 signal_prior: Mapping[str, float] | None = None) -> None:
        self.config, self.clock = config, clock
        self.specs: dict[str, DomainSpec] = {}
        self.fair: dict[str, FairQueue] = {t: FairQueue(window_s=config.window_s,
                                                        starvation_s=config.starvation_s,
                                                        starvation_share=config.starvation_share, clock=clock)
                                           for t in config.tiers}
        for spec in domains:
            if spec.name in self.specs:
                raise ValueError(f"domain {spec.name!r} is listed twice")
            if spec.tier not in self.fair:
                raise ValueError(f"DomainSpec {spec.name!r}.tier: {spec.tier!r} is not one of "
                                 f"SchedulerConfig.tiers {config.tiers}")
            self.specs[spec.name] = spec
        # Each tier's domains take phases (and break ties) in an order stratified by family, so
        # that every trainer step is spread over the mix's families as the quotas are (not filled
        # alphabetically from one): a domain's first tag is its place in that order, as a
        # fraction of one charge, so the domains of a weight class go evenly spread over a round.
        # Phases are spread within each class of equal charge per round (weight, group size):
        # only those domains' services interleave at a fixed rhythm.
        # The trainer tier's weights start from the adaptive prior (`AdaptiveConfig.prior_groups`)
        # from the first round on: phases are spread over each domain's starting weight, so a
        # domain at the floor takes its first group a round of ten later, not in the first pass.
        self.signal = SignalTracker(config.adaptive)
        if signal_prior:
            self.signal.set_prior({d: x for d, x in signal_prior.items()
                                   if d in self.specs and self.specs[d].tier == config.trainer_tier})
        weight0 = {s.name: s.weight * (self.signal.multiplier(s.name) if s.tier == config.trainer_tier else 1.0)
                   for s in domains}
        rank = {t: stratified_ranks([s.name for s in domains if s.tier == t], config.seed)
                for t in config.tiers}
        classes: dict[tuple[str, float], list[str]] = {}
        for spec in domains:
            classes.setdefault((spec.tier, self._charge0(spec) / weight0[spec.name]), []).append(spec.name)
        phase = {name: i / len(names) for names in classes.values()
                 for i, name in enumerate(sorted(names, key=lambda n: rank[self.specs[n].tier][n]))}
        for spec in domains:
            self.fair[spec.tier].add(spec.name, weight0[spec.name], sample_cap=spec.max_sample_share,
                                     cost_cap=spec.max_cost_share, rank=rank[spec.tier][spec.name],
                                     offset=phase[spec.name] * self._charge0(spec) / weight0[spec.name])
            if not spec.continuous:
                self.fair[spec.tier].block(spec.name)
        if not self.specs:
            raise ValueError("the scheduler needs at least one domain")
        self.staleness = StalenessController(config.max_staleness, config.groups_per_step)
        self.version_name = "v0"
        self.quarantine = Quarantine(config.quarantine)
        self._completed = completed

        self.dom = {name: DomainState(spec, config.seed) for name, spec in self.specs.items()}
        """per-domain counters, one object each (one look-up per event)"""
        self._est_sum = 0.0
        self._est_n = 0
        self._tok_sum = 0.0
        self._tok_n = 0
        self.exhausted: dict[str, str] = {}
        """domains retired for the run by an absolute budget (`DomainSpec.max_samples`, ...): why"""

        # groups
        self.groups: dict[str, GroupState] = {}
        """every group admitted and not yet taken or dropped"""
        self.open: dict[str, OrderedDict[str, GroupState]] = {t: OrderedDict() for t in config.tiers}
        """per tier, in admission order: the same groups (oldest first is the trainer's order)"""
        self.launchable: dict[str, OrderedDict[str, GroupState]] = {t: OrderedDict() for t in config.tiers}
        self.submitted: dict[str, deque[tuple[str, str | None]]] = {t: deque() for t in config.tiers}
        """per tier, (domain, group id or None: numbered '<domain>#<n>') of submitted groups"""
        self.backoff: list[tuple[float, int, str, int]] = []
        self._seq = itertools.count()
        self.ready: dict[str, OrderedDict[str, GroupState]] = {t: OrderedDict() for t in config.tiers}
        """per tier, ready groups not yet taken, in completion order"""
        self.admitted_trainer = 0
        self.running_total = 0
        self.recovered: list[str] = []
        """group ids found already complete in the store (after a restart): not run again"""
        self.dropped: deque[tuple[str, str]] = deque(maxlen=1000)
        """(group id, reason) of the latest dropped groups"""
        self.counters: dict[str, int] = {k: 0 for k in (
            "groups_admitted", "groups_ready", "groups_taken", "groups_dropped", "groups_recovered",
            "episodes_launched", "episodes_kept", "episodes_infra_error", "episodes_discarded",
            "episodes_abandoned", "retries", "submitted_dropped", "domains_exhausted")}
        self.staleness_hist: dict[int, int] = {}

    def _charge0(self, spec: DomainSpec) -> float:
        """What a domain's first group is charged (before any cost is measured)."""
        return float(spec.group_size or self.config.group_size) if self.config.share_by == "samples" else 1.0

    def _estimate(self, ds: DomainState) -> float:
        """A group's expected cost: the domain's running average, or, before its first group
        completes, the mean over domains (1.0 before any)."""
        if ds.est_cost is not None:
            return ds.est_cost
        return self._est_sum / self._est_n if self._est_n else 1.0

    def _estimate_tokens(self, ds: DomainState) -> float:
        """A group's expected generated tokens: the domain's running average, or, before its
        first group completes, the mean over domains (1.0 before any)."""
        if ds.est_tokens is not None:
            return ds.est_tokens
        return self._tok_sum / self._tok_n if self._tok_n else 1.0

    def _over_budget(self, d: str) -> str | None:
        """Why `d` has spent an absolute budget, or None."""
        spec, ds = self.specs[d], self.dom[d]
        for field_name, used in (("max_samples", ds.samples), ("max_tokens", ds.tokens),
                                 ("max_sandbox_s", ds.sandbox_s)):
            limit = getattr(spec, field_name)
            if limit is not None and used >= limit:
                return f"{field_name} = {limit} spent ({round(used, 3)})"
        return None

    def _at_limit(self, d: str) -> bool:
        ds = self.dom[d]
        limit = ds.spec.max_concurrency
        return limit is not None and ds.running + ds.queued >= limit

    def _allowed(self, d: str) -> bool:
        return (d not in self.quarantine.quarantined and d not in self.signal.retired
                and d not in self.exhausted)

    def _is_completed(self, gid: str) -> bool:
        c = self._completed
        if c is None:
            return False
        return c(gid) if callable(c) else gid in c

    # == saved form ===================================================================
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume: JSON-able (ages instead of clock readings)."""
        now = self.clock()
        groups = []
        for tier in self.config.tiers:
            for g in self.open[tier].values():
                groups.append({
                    "gid": g.gid, "domain": g.domain, "tier": g.tier, "index": g.index, "size": g.size,
                    "task_seed": g.task_seed, "version": g.version, "policy_version": g.policy_version,
                    "admitted_age": round(now - g.admitted_at, 6), "est_cost": g.est_cost,
                    "est_tokens": g.est_tokens,
                    "status": g.status, "attempts": list(g.attempts), "retries": list(g.retries),
                    "launched": [g.launched(m) for m in range(g.size)]})
        return {
            "format": STATE_FORMAT, "seed": self.config.seed,
            "staleness": self.staleness.state_dict(), "version_name": self.version_name,
            "fair": {t: q.state_dict() for t, q in self.fair.items()},
            "domains": {d: {"next_index": ds.next_index, "est_cost": ds.est_cost,
                            "est_tokens": ds.est_tokens, "stats": ds.stats()}
                        for d, ds in self.dom.items()},
            "exhausted": dict(self.exhausted),
            "quarantine": self.quarantine.state_dict(), "signal": self.signal.state_dict(),
            "counters": dict(self.counters),
            "staleness_hist": {str(k): v for k, v in self.staleness_hist.items()},
            "admitted_trainer": self.admitted_trainer,
            "submitted": {t: list(q) for t, q in self.submitted.items()},
            "running_episodes": self.running_total, "groups": groups,
            "recovered": list(self.recovered), "dropped": [list(x) for x in self.dropped]}

    def _load_state(self, state: dict[str, Any],
                    recover: Callable[[GroupState, bool], None]) -> None:
        """Restore a `state_dict()`. A group the store holds whole is handed to
        `recover(group, running)` (the core's decision) in its place in admission order."""
        if state.get("format") != STATE_FORMAT:
            raise ValueError(f"scheduler state: format {state.get('format')!r} is not {STATE_FORMAT}")
        if state.get("seed") != self.config.seed:
            raise ValueError(f"scheduler state: saved with seed {state.get('seed')!r}, but "
                             f"SchedulerConfig.seed is {self.config.seed} (task seeds would differ)")
        now = self.clock()
        self.staleness.load_state_dict(state["staleness"])
        self.version_name = str(state["version_name"])
        for tier, fs in state["fair"].items():
            if tier in self.fair:
                self.fair[tier].load_state_dict(fs)
        known = self.specs
        for d, s in state["domains"].items():
            if d not in known:
                continue
            ds = self.dom[d]
            ds.next_index = int(s["next_index"])
            if s["est_cost"] is not None:
                ds.est_cost = float(s["est_cost"])
                self._est_sum += ds.est_cost
                self._est_n += 1
            if s.get("est_tokens") is not None:  # absent in states saved before token quotas
                ds.est_tokens = float(s["est_tokens"])
                self._tok_sum += ds.est_tokens
                self._tok_n += 1
            for k, v in s["stats"].items():
                if k in DomainState.STATS:
                    setattr(ds, k, v)
        self.exhausted = {d: str(why) for d, why in state.get("exhausted", {}).items() if d in known}
        self.quarantine.load_state_dict(state["quarantine"])
        self.signal.load_state_dict(state["signal"])
        self.counters.update({k: int(v) for k, v in state["counters"].items()})
        self.counters["episodes_abandoned"] += int(state["running_episodes"])
        self.staleness_hist = {int(k): int(v) for k, v in state["staleness_hist"].items()}
        self.admitted_trainer = int(state["admitted_trainer"])
        for tier, q in state["submitted"].items():
            for entry in q:  # [domain, group id or None]; a bare domain name before named groups
                d, gid = (entry, None) if isinstance(entry, str) else entry
                if d in known:
                    self.submitted[tier].append((d, gid))
        self.recovered = list(state["recovered"])
        self.dropped.extend((str(a), str(b)) for a, b in state["dropped"])
        trainer = self.config.trainer_tier
        for s in state["groups"]:
            g = GroupState(gid=s["gid"], domain=s["domain"], tier=s["tier"], index=int(s["index"]),
                           size=int(s["size"]), task_seed=int(s["task_seed"]), version=int(s["version"]),
                           policy_version=str(s["policy_version"]),
                           admitted_at=now - float(s["admitted_age"]),
                           est_cost=float(s["est_cost"]), est_tokens=float(s.get("est_tokens", 0.0)),
                           seq=next(self._seq))
            was_ready = s["status"] == "ready"
            if g.domain not in known or g.tier not in self.fair:
                self.counters["groups_dropped"] += 1
                self.dropped.append((g.gid, "domain no longer configured"))
                if g.tier == trainer:
                    self.staleness.accepted -= was_ready
                    self.staleness.running -= not was_ready
                continue
            if self._is_completed(g.gid):
                recover(g, not was_ready)
                continue
            # Re-issue: every member runs again from scratch (a fresh sandbox) at the attempt it
            # was at. Its sampling seed derives from (group, member, attempt), so it samples what
            # the interrupted run sampled, and the store keeps one row per (run, group, member,
            # attempt). A caller that knows an attempt was stored as an infra_error after the save
            # moves the member on in the state first (`posttrain.training.resume`).
            g.attempts = [int(a) for a in s["attempts"]]
            g.retries = [int(r) for r in s["retries"]]
            g.unlaunched.extend(range(g.size))
            g.ready_since = {m: now for m in range(g.size)}
            if g.tier == trainer and was_ready:
                self.staleness.accepted -= 1
                self.staleness.running += 1
            self.groups[g.gid] = g
            self.open[g.tier][g.gid] = g
            self.launchable[g.tier][g.gid] = g
            self.dom[g.domain].queued += g.size

    # == metrics ======================================================================
    def metrics(self, per_domain: bool = True) -> dict[str, Any]:
        """A JSON-able snapshot (see `Scheduler.metrics`)."""
        c = dict(self.counters)
        c["lost"] = (c["episodes_launched"] - c["episodes_kept"] - c["episodes_infra_error"]
                     - c["episodes_discarded"] - c["episodes_abandoned"] - self.running_total)
        active_weight: dict[str, float] = {t: 0.0 for t in self.config.tiers}
        for name, spec in self.specs.items():
            if spec.continuous and self._allowed(name):
                active_weight[spec.tier] += self.fair[spec.tier].weight(name)
        domains: dict[str, dict[str, Any]] = {}
        max_wait = 0.0
        all_waits: list[float] = []
        for name, spec in self.specs.items():
            fair = self.fair[spec.tier]
            sample_share, cost_share = fair.shares(name)
            max_gap, current = fair.wait(name)
            allowed = self._allowed(name)
            if spec.continuous and allowed:
                max_wait = max(max_wait, max_gap, current)
            ds = self.dom[name]
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
                "signal_share": self.signal.signal_share(name),
                "infra_error_rate": round(self.quarantine.rate(name), 4),
                "quarantined": name in self.quarantine.quarantined,
                "retired": name in self.signal.retired,
                "exhausted": self.exhausted.get(name),
                **{k: (round(v, 6) if isinstance(v, float) else v) for k, v in st.items()}}
        hist = self.staleness_hist
        n_taken = sum(hist.values())
        st8 = self.staleness
        return {
            "version": st8.version, "version_name": self.version_name,
            "running_episodes": self.running_total,
            "ready_groups": {t: len(r) for t, r in self.ready.items()},
            "counters": c, "lost": c["lost"], "retries": c["retries"],
            "infra_errors": c["episodes_infra_error"],
            "queue_wait_p50_s": _pct(all_waits, 50), "queue_wait_p99_s": _pct(all_waits, 99),
            "max_wait_s": round(max_wait, 6),
            "starvation_guard_groups": sum(q.guard_served for q in self.fair.values()),
            "quarantined": {d: dict(r) for d, r in self.quarantine.quarantined.items()},
            "retired": {d: dict(r) for d, r in self.signal.retired.items()},
            "exhausted": dict(self.exhausted),
            "staleness": {"max_staleness": self.config.max_staleness, "accepted": st8.accepted,
                          "running": st8.running, "capacity": st8.capacity(),
                          "histogram": {str(k): v for k, v in sorted(hist.items())},
                          "max": max(hist) if hist else None,
                          "mean": round(sum(k * v for k, v in hist.items()) / n_taken, 4)
                          if n_taken else None},
            **({"domains": domains} if per_domain else {})}


def _pct(values: Iterable[float], q: float) -> float | None:
    arr = np.fromiter(values, float)
    return round(float(np.percentile(arr, q)), 6) if arr.size else None
