"""The scheduler's decisions, with no event loop, threads or model: what to launch next, what to
do with a finished episode, which groups the trainer gets.

`SchedulerCore` is driven by a runner (`posttrain.scheduling.runner.Scheduler`), which launches
the episodes it names and reports them back. Keeping every decision here, synchronous and
clock-injected, is what lets tests check quota arithmetic, tiers, retries, quarantine and
staleness step by step, and lets the state be saved and restored exactly.

Life of a group: admitted (a domain picked by its tier's fair queue, or taken from `submit`ted
work) -> its G members launch as slots free -> each member ends completed/truncated (kept) or
infra_error (re-run from scratch on a fresh driver with `attempt + 1` after a backoff, up to
`RetryConfig.max_retries`) -> the group is *ready* when every member is kept, or *dropped*
(retries exhausted, domain quarantined) and counted -> the trainer takes ready groups.
"""

from __future__ import annotations

import heapq
import itertools
import random
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from posttrain.scheduling.config import DomainSpec, SchedulerConfig
from posttrain.scheduling.health import PolicyOutage
from posttrain.scheduling.state import Completed, CoreState, GroupState
from posttrain.scheduling.work import EpisodeSpec, Group, Usage, derive_seed, mix_seed
from posttrain.values.episode import EpisodeResult
from posttrain.values.trajectory import Trajectory

__all__ = ["Completed", "SchedulerCore"]


class SchedulerCore(CoreState):
    def __init__(self, config: SchedulerConfig, domains: Sequence[DomainSpec], *,
                 clock: Callable[[], float] = time.monotonic,
                 on_group: Callable[[Group], None] | None = None,
                 on_failure: Callable[[EpisodeResult], None] | None = None,
                 completed: Completed | None = None,
                 load_group: Callable[[str], list[Trajectory]] | None = None,
                 signal_prior: Mapping[str, float] | None = None) -> None:
        """`on_group(group)` is called as each group becomes ready (store it then: a group is
        stored whole or not at all); `on_failure(result)` for each infra_error episode.
        `signal_prior` (domain -> expected share of groups with a reward spread,
        `health.expected_signal`; `AdaptiveConfig.prior_groups`) starts the trainer tier's weights.
        `completed` (a set or a predicate over group ids) names groups already stored: such a
        group is not run again but handed to the trainer as it is in the store, through
        `load_group(group_id) -> trajectories` (without it: `Group.recovered` is set and its
        trajectories are left for the caller to load)."""
        super().__init__(config, domains, clock=clock, completed=completed, signal_prior=signal_prior)
        self.on_group, self.on_failure = on_group, on_failure
        self._load_group = load_group
        self._has_trainer_domains = any(s.tier == config.trainer_tier and s.continuous for s in domains)
        self._endless_tiers = frozenset(s.tier for s in domains if s.continuous)
        """tiers whose fair queue can name a domain (only continuous domains are in it unblocked):
        another tier admits only submitted groups"""
        self._rng = random.Random(derive_seed(config.seed, "retry-jitter"))
        self.worker_slots, self.generator_slots = config.max_running, config.batch.max_inflight
        self.outage = PolicyOutage(config.retry.policy_outage_s)
        self._unlearned: list[Group] = []
        """groups recovered from the store whose learning signal the adaptive weights have not
        seen yet (see `_recover`)"""

    # == what runs next ===============================================================
    def next_episode(self) -> EpisodeSpec | None:
        """The episode to launch in a free slot, highest tier first: members of admitted groups
        before new groups. None when there is no free slot or nothing may run now."""
        if self.running_total >= self.config.max_running:
            return None
        if self.backoff:
            self._release_retries()
        for tier in self.config.tiers:
            spec = self._launch_from(tier) if self.launchable[tier] else None
            if spec is not None:
                return spec
            while (g := self._admit(tier)) is not None:
                spec = self._launch_from(tier)
                if spec is not None:
                    return spec
                if g.status == "open" and g.unlaunched:
                    break  # admitted but its domain is at its concurrency limit
        return None

    def next_retry_at(self) -> float | None:
        """When the earliest retry in backoff becomes launchable (for the runner's timer)."""
        return self.backoff[0][0] if self.backoff else None

    def submit(self, domain: str, n_groups: int = 1, group_ids: Sequence[str] | None = None) -> None:
        """Queue `n_groups` groups of `domain` in its tier, ahead of that tier's fair share
        (evaluation sets, interactive requests); `group_ids` names them (one group each) instead
        of the domain's numbering, so a workload's own identities reach the trajectories."""
        if domain not in self.specs:
            raise KeyError(f"submit: unknown domain {domain!r}")
        if n_groups < 1:
            raise ValueError(f"submit: n_groups must be >= 1, got {n_groups}")
        ids: Sequence[str | None] = list(group_ids) if group_ids is not None else [None] * n_groups
        if not ids:
            raise ValueError("submit: group_ids is empty")
        self.submitted[self.specs[domain].tier].extend((domain, gid) for gid in ids)

    def set_version(self, name: str) -> int:
        """The trainer made a policy update: new groups are generated by version `name`."""
        self.staleness.set_version(self.staleness.version + 1)
        self.version_name = name
        return self.staleness.version

    # == results ======================================================================
    def episode_finished(self, spec: EpisodeSpec, result: EpisodeResult, usage: Usage) -> None:
        traj = result.trajectory
        d = spec.domain
        st = self.dom[d]
        st.running -= 1
        self.running_total -= 1
        st.sandbox_s += usage.sandbox_s
        st.gen_s += usage.gen_s
        st.tokens += usage.tokens
        self._check_budget(d)
        g = self.groups.get(spec.group_id)
        traj.group_id, traj.attempt, traj.member = spec.group_id, spec.attempt, spec.member
        if traj.status == "infra_error":
            self.counters["episodes_infra_error"] += 1
            st.infra_errors += 1
            if self.on_failure is not None:
                self.on_failure(result)
            where = traj.error.where if traj.error else ""
            error = f"{traj.error.type}: {traj.error.message}" if traj.error else ""
            self.outage.record(where == "policy", error, self.clock())
            if where != "policy":  # a backend outage is not the domain's fault
                if self.quarantine.record(d, True, error) is not None:
                    self._quarantine(d)
        else:
            self.outage.ended()
            self.quarantine.record(d, False)
        if g is None or g.status != "open" or g.attempts[spec.member] != spec.attempt:
            if traj.status != "infra_error":
                self.counters["episodes_discarded"] += 1
            self._update_block(d)
            return  # a late result of a dropped group or an abandoned attempt
        g.running.discard(spec.member)
        g.usage.add(usage)
        if traj.status == "infra_error":
            if traj.error is not None and not traj.error.retryable:  # ErrorInfo.retryable: only 'context'
                self._drop(g, "the prompt does not fit the model's context")
            elif g.retries[spec.member] < self.config.retry.max_retries:
                self._retry(g, spec.member)
            else:
                self._drop(g, "retries exhausted")
        else:
            self.counters["episodes_kept"] += 1
            g.members[spec.member] = result
            g.kept += 1
            if g.kept == g.size:
                self._complete(g)
        self._update_block(d)

    def episode_abandoned(self, spec: EpisodeSpec) -> None:
        """A launched episode that will never report back (the run is being torn down)."""
        self.dom[spec.domain].running -= 1
        self.running_total -= 1
        self.counters["episodes_abandoned"] += 1

    # == the trainer's side ===========================================================
    def take(self, n: int) -> list[Group] | None:
        """`n` ready trainer-tier groups, or None if they cannot be given yet. The oldest groups
        that must go now for no group to ever pass the staleness bound come first (None until
        they are ready); then the oldest ready ones. Each trajectory's `policy_staleness` is set.
        More than `n` only if the trainer took fewer than `groups_per_step` before."""
        tier = self.config.trainer_tier
        while self._unlearned:  # recovered groups, in the order they were admitted
            group = self._unlearned.pop(0)
            mult, retire = self.signal.record(group.domain, group.has_signal, group.all_passed)
            self.dom[group.domain].signal_groups += group.has_signal
            self.fair[tier].set_weight(group.domain, self.specs[group.domain].weight * mult)
            if retire:
                self._update_block(group.domain)
        if len(self.ready[tier]) < n:
            return None
        open_groups = list(self.open[tier].values())  # admission order
        must = self.staleness.required([g.version for g in open_groups])
        if any(g.status != "ready" for g in open_groups[:must]):
            return None
        size = max(n, must)
        batch = open_groups[:must]
        for g in open_groups[must:]:
            if len(batch) >= size:
                break
            if g.status == "ready":
                batch.append(g)
        if len(batch) < size:
            return None
        return [self._hand_over(g) for g in batch]

    def take_ready(self, tier: str, n: int | None = None) -> list[Group]:
        """Up to `n` ready groups of any tier in the order they completed, without the staleness
        rule (for the evaluator and background consumers)."""
        ready = self.ready[tier]
        picked = list(itertools.islice(ready.values(), n)) if n is not None else list(ready.values())
        return [self._hand_over(g) for g in picked]

    def finished(self) -> bool:
        """True when nothing is in flight or queued and no more work will be drawn: the trainer
        tier's `max_groups` are all admitted (or it has no domain that can run) and no other
        tier has endless (`continuous`) work. Ready groups may still wait to be taken."""
        if self.running_total or self.backoff or any(self.submitted.values()):
            return False
        if any(g.status == "open" for g in self.groups.values()):
            return False
        cap, trainer = self.config.max_groups, self.config.trainer_tier
        for spec in self.specs.values():
            if not spec.continuous or not self._allowed(spec.name):
                continue
            if spec.tier != trainer or cap is None or self.admitted_trainer < cap:
                return False  # this domain would keep drawing groups
        return True

    def stalled_reason(self, n: int) -> str | None:
        """Why the trainer tier can never give `n` more groups, or None if it still can (or has
        no domains: an evaluation-only run)."""
        tier = self.config.trainer_tier
        outage = self.outage.reason(self.clock())
        if outage:
            return outage
        if not self._has_trainer_domains:
            return None
        if self.running_total or self.backoff or self.launchable[tier] or self.submitted[tier]:
            return None
        if len(self.ready[tier]) >= n:
            return None
        if self.config.max_groups is not None and self.admitted_trainer >= self.config.max_groups:
            return None  # a finished workload, not a stall
        if not self.staleness.can_admit():
            return (f"staleness bound reached at policy version {self.staleness.version} "
                    f"({self.staleness.accepted} groups accepted, capacity {self.staleness.capacity()}, "
                    f"{len(self.ready[tier])} ready of {n} asked): call set_policy_version() after "
                    "each training step")
        if self.fair[tier].pick() is None:
            return (f"no {tier!r} domain can run: quarantined {sorted(self.quarantine.quarantined)}, "
                    f"retired {sorted(self.signal.retired)}, budget spent {sorted(self.exhausted)}")
        return None

    def release_quarantine(self, domain: str) -> None:
        self.quarantine.release(domain)
        self._update_block(domain)

    # == internals: admission =========================================================
    def _admit(self, tier: str) -> GroupState | None:
        submitted = self.submitted[tier]
        if not submitted and tier not in self._endless_tiers:
            return None  # the common miss of a fixed workload: asked after each episode ends
        trainer = tier == self.config.trainer_tier
        if trainer and not self.staleness.can_admit():
            return None
        domain = None
        named = None
        for _ in range(len(submitted)):
            d, gid = entry = submitted.popleft()
            if not self._allowed(d):
                self.counters["submitted_dropped"] += 1
                continue
            if self._at_limit(d):
                submitted.append(entry)
                continue
            domain, named = d, gid
            break
        from_submitted = domain is not None
        if domain is None:
            if trainer and self.config.max_groups is not None \
                    and self.admitted_trainer >= self.config.max_groups:
                return None
            domain = self.fair[tier].pick()
            if domain is None:
                return None
        ds = self.dom[domain]
        size = ds.spec.group_size or self.config.group_size
        index = ds.next_index
        ds.next_index = index + 1
        est = self._estimate(ds)
        est_tokens = self._estimate_tokens(ds)
        mode = self.config.share_by
        amount = float(size) if mode == "samples" else est if mode == "cost" else est_tokens
        self.fair[tier].charge(domain, amount, size, est, in_turn=not from_submitted)
        gid = named or f"{domain}#{index}"
        now = self.clock()
        g = GroupState(gid=gid, domain=domain, tier=tier, index=index, size=size,
                       task_seed=ds.task_seed(index, "task"),
                       version=self.staleness.version, policy_version=self.version_name,
                       admitted_at=now, est_cost=est, est_tokens=est_tokens,
                       seq=next(self._seq))
        self.counters["groups_admitted"] += 1
        if trainer:
            self.admitted_trainer += 1
            self.staleness.admit()
        self.groups[gid] = g
        self.open[tier][gid] = g
        if self._is_completed(gid):
            self._recover(g, running=True)
            return g
        for m in range(size):
            g.unlaunched.append(m)
            g.ready_since[m] = now
        ds.queued += size
        self.launchable[tier][gid] = g
        self._update_block(domain)
        return g

    def _launch_from(self, tier: str) -> EpisodeSpec | None:
        launchable = self.launchable[tier]
        for gid, g in launchable.items():
            ds = self.dom[g.domain]
            limit = ds.spec.max_concurrency
            if limit is not None and ds.running >= limit:
                continue
            m = g.unlaunched.popleft()
            if not g.unlaunched:
                del launchable[gid]
            g.running.add(m)
            ds.running += 1
            ds.queued -= 1
            self.running_total += 1
            self.counters["episodes_launched"] += 1
            ds.waits.append(self.clock() - g.ready_since.pop(m))
            attempt = g.attempts[m]
            return EpisodeSpec(gid, g.domain, tier, ds.spec.split, m, attempt, g.task_seed,
                               mix_seed(g.task_seed, m, attempt), g.policy_version, g.version, g.task)
        return None

    def cost_of(self, usage: Usage) -> float:
        """Dominant-resource seconds (DRF): the larger share of the two resources it used."""
        return max(usage.sandbox_s / self.worker_slots, usage.gen_s / self.generator_slots)

    def _check_budget(self, d: str) -> None:
        """Retire `d` for the run once it has spent an absolute budget; its groups in flight
        finish (their work is done or paid for), no new one is drawn."""
        if not self.dom[d].budgeted or d in self.exhausted:
            return
        why = self._over_budget(d)
        if why is not None:
            self.exhausted[d] = why
            self.counters["domains_exhausted"] += 1
            self._update_block(d)

    def _update_block(self, d: str) -> None:
        spec = self.specs[d]
        if not spec.continuous:
            return
        fair = self.fair[spec.tier]
        if spec.max_concurrency is None and not fair.is_blocked(d) and self._allowed(d):
            return  # the common case: nothing can have changed
        if not self._allowed(d) or self._at_limit(d):
            fair.block(d)
        else:
            fair.unblock(d)

    # == internals: outcomes ==========================================================
    def _retry(self, g: GroupState, m: int) -> None:
        g.retries[m] += 1
        g.attempts[m] += 1
        self.counters["retries"] += 1
        self.dom[g.domain].retries += 1
        r = self.config.retry
        delay = min(r.backoff_max_s, r.backoff_s * 2 ** (g.retries[m] - 1))
        delay *= 1 + r.jitter * self._rng.random()
        g.waiting.add(m)
        self.dom[g.domain].queued += 1
        heapq.heappush(self.backoff, (self.clock() + delay, next(self._seq), g.gid, m))

    def _release_retries(self) -> None:
        now = self.clock()
        while self.backoff and self.backoff[0][0] <= now:
            _, _, gid, m = heapq.heappop(self.backoff)
            g = self.groups.get(gid)
            if g is None or g.status != "open" or m not in g.waiting:
                continue
            g.waiting.discard(m)
            g.unlaunched.append(m)
            g.ready_since[m] = now
            self.launchable[g.tier][gid] = g

    def _complete(self, g: GroupState) -> None:
        g.status = "ready"
        g.completed_at = self.clock()
        self.launchable[g.tier].pop(g.gid, None)
        self.ready[g.tier][g.gid] = g
        self.counters["groups_ready"] += 1
        st = self.dom[g.domain]
        st.groups_ready += 1
        st.samples += g.size
        actual = self.cost_of(g.usage)
        st.cost += actual
        prev = st.est_cost
        st.est_cost = actual if prev is None else 0.7 * prev + 0.3 * actual
        self._est_sum += st.est_cost - (prev or 0.0)
        self._est_n += prev is None
        tokens = float(g.usage.tokens)
        prev_t = st.est_tokens
        st.est_tokens = tokens if prev_t is None else 0.7 * prev_t + 0.3 * tokens
        self._tok_sum += st.est_tokens - (prev_t or 0.0)
        self._tok_n += prev_t is None
        mode = self.config.share_by
        fair = self.fair[g.tier]
        fair.adjust(g.domain, actual - g.est_cost if mode == "cost"
                    else tokens - g.est_tokens if mode == "tokens" else 0.0, actual - g.est_cost)
        self._check_budget(g.domain)
        group = g.group = g.to_group([t for t in g.members if t is not None])
        if g.tier == self.config.trainer_tier:
            self.staleness.accept()
            st.signal_groups += group.has_signal
            mult, retire = self.signal.record(g.domain, group.has_signal, group.all_passed)
            fair.set_weight(g.domain, self.specs[g.domain].weight * mult)
            if retire:
                self._update_block(g.domain)
        if self.on_group is not None:
            self.on_group(group)

    def _drop(self, g: GroupState, reason: str) -> None:
        self.dom[g.domain].queued -= len(g.unlaunched) + len(g.waiting)
        g.status = "dropped"
        self._forget(g)
        self.counters["groups_dropped"] += 1
        self.dom[g.domain].groups_dropped += 1
        self.dropped.append((g.gid, reason))
        if g.tier == self.config.trainer_tier:
            self.staleness.reject()

    def _quarantine(self, d: str) -> None:
        for g in [g for g in self.groups.values() if g.domain == d and g.status == "open"]:
            self._drop(g, "domain quarantined")
        self._update_block(d)

    def _recover(self, g: GroupState, *, running: bool) -> None:
        """`g` is complete in the store: ready at once, its trajectories loaded from there."""
        self.recovered.append(g.gid)
        self.counters["groups_recovered"] += 1
        trajs = list(self._load_group(g.gid)) if self._load_group is not None else []
        if self._load_group is not None and len(trajs) != g.size:
            raise ValueError(f"resume: the store holds {len(trajs)} trajectories of group {g.gid!r}, "
                             f"not {g.size}: `completed` must name only groups stored whole")
        g.status = "ready"
        g.completed_at = self.clock()
        g.group = g.to_group([EpisodeResult(t, None) for t in trajs])
        g.group.recovered = True
        self.groups[g.gid] = g
        self.open[g.tier][g.gid] = g
        self.ready[g.tier][g.gid] = g
        if g.tier == self.config.trainer_tier and running:
            self.staleness.accept()
        if g.tier == self.config.trainer_tier and running and self._load_group is not None:
            # It completed after the save: the adaptive weights learn from it as they did in the
            # run that was interrupted, so the resumed run draws the same domains. Not now but
            # when the trainer takes groups: the interrupted run's groups completed after the
            # admission of their step's other groups, which were charged at the old weights.
            self._unlearned.append(g.group)

    def _forget(self, g: GroupState) -> None:
        self.groups.pop(g.gid, None)
        self.open[g.tier].pop(g.gid, None)
        self.launchable[g.tier].pop(g.gid, None)

    def _hand_over(self, g: GroupState) -> Group:
        staleness = 0
        if g.tier == self.config.trainer_tier:
            staleness = self.staleness.staleness(g.version)
            self.staleness_hist[staleness] = self.staleness_hist.get(staleness, 0) + 1
        g.status = "taken"
        self._forget(g)
        self.ready[g.tier].pop(g.gid, None)
        self.counters["groups_taken"] += 1
        group = g.group
        assert group is not None  # built when the group became ready
        group.staleness = staleness
        for t in group.trajectories:
            t.policy_staleness = staleness
        return group

    # == state ========================================================================
    @classmethod
    def from_state(cls, state: dict[str, Any], config: SchedulerConfig, domains: Sequence[DomainSpec],
                   *, completed: Completed, **kwargs: Any) -> SchedulerCore:
        """Resume: groups open at save time are re-issued exactly once (members re-run from
        scratch at the attempt they were at: seeded by identity, they sample the same), unless
        `completed` (the store's group ids) says they finished after the save: those are handed
        over from the store (see `recovered`, `load_group`)."""
        core = cls(config, domains, completed=completed, **kwargs)
        core._load_state(state, recover=lambda g, running: core._recover(g, running=running))
        for d, spec in core.specs.items():
            # the adaptive weights as they were at the save (the fair queue's state holds tags,
            # not weights): without this a resumed run charges its next groups at weight 1
            core.fair[spec.tier].set_weight(d, spec.weight * core.signal.multiplier(d))
            core._update_block(d)
        for d in list(core.quarantine.quarantined):
            if d in core.specs:
                core._quarantine(d)
        return core

