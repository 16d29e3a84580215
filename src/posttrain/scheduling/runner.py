"""The asynchronous scheduler: runs what `SchedulerCore` decides, on a worker backend, with
continuous batching of generation.

    factory = RolloutEpisodeFactory(...)
    sched = Scheduler(config, domains, policy, factory=factory, tasks=factory)
    async with sched:
        for step in range(steps):
            groups = await sched.take(config.groups_per_step)   # ready groups, staleness-bounded
            ...train on groups...
            sched.set_policy_version(f"step-{step + 1}")       # after the weights changed

Every running episode is an asyncio task: `start` on a worker, then `generate` through the shared
batcher and `advance` on a worker, turn after turn (the last call also fetches `result`). When it
ends, its slot goes to whatever the core names next. An episode of a light domain
(`DomainSpec.light`) on the local backend without an episode deadline has no task: its steps run
on the loop's thread anyway, so it is driven by callbacks (`_InlineEpisode`: started by a
`call_soon`, continued by its generation future's done-callback), which run at the very points
of the loop where its task would have run, without a task and a chain of coroutines per episode.
The same code path runs real episodes (`posttrain.rollout.episode.Episode`) and simulated ones
(`posttrain.scheduling.sim`).

This is the one episode engine: training (`posttrain.pipeline`), evaluation, `posttrain rollout`
and the domain self-check are workloads on it (`posttrain.scheduling.engine` runs a fixed set).
A group's task is resolved once, here, from the `TaskSource` and travels with every member and
its `EpisodeResult` (trajectory, task, final workspace) to `on_group` / `on_failure`. A scripted
policy is handed each group's script at that moment. Episodes of sandboxed domains wait for one
of `SchedulerConfig.max_sandboxes` slots before they start, so live sandboxes stay bounded
whatever the size of the workload. Every finished episode is counted against the policy version
that generated it (`posttrain.scheduling.versions`: a jump in the infra-error rate is flagged).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from posttrain.policies.base import Policy, ScriptedPlayer
from posttrain.scheduling.backends import LocalBackend, Step, WorkerBackend
from posttrain.scheduling.batcher import GenerationBatcher
from posttrain.scheduling.config import DomainSpec, SchedulerConfig
from posttrain.scheduling.core import Completed, SchedulerCore
from posttrain.scheduling.versions import VersionInfraRate
from posttrain.scheduling.work import EpisodeFactory, EpisodeSpec, Group, TaskSource, Usage
from posttrain.values.episode import EpisodeResult
from posttrain.values.trajectory import ErrorInfo, Trajectory

_NO_DEADLINE = contextlib.nullcontext()
"""a reusable do-nothing async context (`nullcontext` keeps no state)"""


class EpisodeTimeout(RuntimeError):
    """An episode ran past `RetryConfig.episode_timeout_s`."""


class SchedulerStalled(RuntimeError):
    """Nothing can make progress (every trainer domain quarantined or retired, or the trainer did
    not advance the policy version); the message says which."""


class Scheduler:
    def __init__(self, config: SchedulerConfig, domains: Sequence[DomainSpec], policy: Policy, *,
                 factory: EpisodeFactory | None = None, backend: WorkerBackend | None = None,
                 workers: int = 32, state: dict[str, Any] | None = None,
                 completed: Completed | None = None,
                 load_group: Callable[[str], list[Trajectory]] | None = None,
                 on_group: Callable[[Group], None] | None = None,
                 on_failure: Callable[[EpisodeResult], None] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 version_name: str | None = None, tasks: TaskSource | None = None,
                 player: ScriptedPlayer | None = None, signal_prior: Mapping[str, float] | None = None) -> None:
        """`factory` builds a driver per `EpisodeSpec` (on the worker); give it, or a `backend`
        built with it. `state` (from `state_dict`) resumes a killed run; `completed` (the store's
        group ids: a set or a predicate) keeps finished groups from running again; they reach the
        trainer loaded by `load_group(group_id)` (or flagged `Group.recovered`, left empty).
        `version_name` names the starting policy version of a fresh run (a resumed run keeps the
        name saved in `state`), so the first groups are recorded under it. `tasks` resolves each
        group's task once (None: simulated episodes, which have none). `player` is the scripted
        policy to hand each group's scripts to when `policy` wraps one (e.g. to seed it); by
        default `policy` itself if it is a `ScriptedPlayer`."""
        if backend is None:
            if factory is None:
                raise ValueError("Scheduler needs an episode factory (or a backend built with one)")
            backend = LocalBackend(factory, workers=workers)
        self.config, self.policy, self.backend, self.clock = config, policy, backend, clock
        kwargs: dict[str, Any] = dict(clock=clock, on_group=on_group, on_failure=on_failure, load_group=load_group,
                                      signal_prior=signal_prior)
        if state is not None:
            self.core = SchedulerCore.from_state(state, config, domains, completed=completed or (), **kwargs)
        else:
            self.core = SchedulerCore(config, domains, completed=completed, **kwargs)
            if version_name is not None:
                self.core.version_name = version_name
        self.core.worker_slots = backend.capacity
        self.tasks = tasks
        # checked once: a runtime protocol check costs tens of microseconds
        self._scripted = player if player is not None else (
            policy if isinstance(policy, ScriptedPlayer) else None)
        self.batcher = GenerationBatcher(policy, config.batch)
        self.versions = VersionInfraRate()
        self._sandboxed = {d.name for d in domains if d.sandboxed}
        self._light = {d.name for d in domains if d.light}
        self.max_sandboxes = config.max_sandboxes or backend.capacity
        self._sandbox_slots: asyncio.Semaphore | None = None
        self.sandboxes_in_use = 0
        self.sandboxes_peak = 0
        """most episodes of sandboxed domains in flight at once (never above `max_sandboxes`)"""
        self._tier_rank = {t: i for i, t in enumerate(config.tiers)}
        self._tasks: set[asyncio.Task] = set()
        self._by_callback = self._callback_domains()
        self._inline: set[_InlineEpisode] = set()
        """light episodes launched and not finished (see `_InlineEpisode`)"""
        self._changed: asyncio.Event | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = float("inf")
        self._error: BaseException | None = None
        self._started_at: float | None = None
        self._closed_at: float | None = None

    def _callback_domains(self) -> frozenset[str]:
        """The domains whose episodes run without a task (`_InlineEpisode`): the light ones,
        when nothing needs a task: a deadline is a task's cancellation, and only the local
        backend steps an episode on the loop's thread."""
        if not isinstance(self.backend, LocalBackend) or self.config.retry.episode_timeout_s is not None:
            return frozenset()
        return frozenset(self._light)

    # -- lifecycle --------------------------------------------------------------------
    async def start(self) -> None:
        self.backend.open()
        self.batcher.start()
        self._sandbox_slots = asyncio.Semaphore(self.max_sandboxes)
        self._changed = asyncio.Event()
        self._started_at = time.perf_counter()
        self._fill()

    async def close(self) -> None:
        """Stop: running episodes are cancelled (counted as abandoned; their groups would be
        re-issued by a resume from a saved state)."""
        if self._timer is not None:
            self._timer.cancel()
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        for ep in self._inline:  # as a cancelled task: abandoned, its late callbacks ignored
            if ep.started is not None:
                ep.started.cancel()  # (shared by the episodes launched with it: all abandoned here)
            self.core.episode_abandoned(ep.spec)
        self._inline.clear()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.batcher.close()
        await self.backend.close()
        if self._started_at is not None and self._closed_at is None:
            self._closed_at = time.perf_counter()

    async def __aenter__(self) -> Scheduler:
        await self.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    # -- the trainer's side -----------------------------------------------------------
    async def take(self, n: int) -> list[Group]:
        """Wait for `n` trainer-tier groups (due ones first, then oldest). Fewer only when a fixed
        workload (`max_groups`) is exhausted; raises `SchedulerStalled` if none can ever come."""
        while True:
            self._raise_if_failed()
            groups = self.core.take(n)
            if groups is not None:
                return groups
            reason = self.core.stalled_reason(n)
            if reason:
                raise SchedulerStalled(reason)
            if self.core.finished():
                return self.core.take_ready(self.config.trainer_tier)
            await self._wait_change()

    async def take_more(self, n: int) -> list[Group]:
        """`n` more trainer-tier groups for the same update (dynamic sampling): admission at the
        current policy version is extended by `n` first, so the staleness bound holds as before
        (`StalenessController.grant`); then as `take`."""
        self.core.staleness.grant(n)
        self._fill()
        return await self.take(n)

    async def take_ready(self, tier: str, n: int) -> list[Group]:
        """Wait for `n` ready groups of `tier` (evaluation, background), oldest first."""
        out: list[Group] = []
        while len(out) < n:
            self._raise_if_failed()
            out += self.core.take_ready(tier, n - len(out))
            if len(out) < n:
                if self.core.finished() and not self.core.open[tier]:
                    break
                await self._wait_change()
        return out

    async def wait_finished(self) -> None:
        """Wait until a fixed workload (`max_groups`, submitted work) is done."""
        while not self.core.finished():
            self._raise_if_failed()
            reason = self.core.stalled_reason(1)
            if reason:
                raise SchedulerStalled(reason)
            await self._wait_change()

    def set_policy_version(self, name: str) -> int:
        version = self.core.set_version(name)
        self._fill()
        return version

    def submit(self, domain: str, n_groups: int = 1, group_ids: Sequence[str] | None = None) -> None:
        self.core.submit(domain, n_groups, group_ids)
        self._fill()

    def release_quarantine(self, domain: str) -> None:
        self.core.release_quarantine(domain)
        self._fill()

    @property
    def recovered(self) -> list[str]:
        """Group ids that a resume found already complete in the store (not run again)."""
        return list(self.core.recovered)

    def state_dict(self) -> dict[str, Any]:
        return self.core.state_dict()

    def metrics(self, per_domain: bool = True) -> dict[str, Any]:
        """A JSON-able snapshot for the progress display and the metrics JSONL: generator busy
        fraction, worker utilisation, queue waits (p50/p99, overall and per domain), samples and
        cost per domain against quota (`per_domain=False` leaves the per-domain table out),
        retries, infrastructure errors, quarantined and retired domains (with why), staleness,
        and episode accounting (`lost` must stay 0)."""
        m = self.core.metrics(per_domain)
        end = self._closed_at or time.perf_counter()
        elapsed = end - self._started_at if self._started_at is not None else 0.0
        m["elapsed_s"] = round(elapsed, 6)
        m["generator_busy"] = round(self.batcher.busy_seconds() / elapsed, 6) if elapsed > 0 else None
        m["worker_utilization"] = (round(self.backend.busy_s / (self.backend.capacity * elapsed), 6)
                                   if elapsed > 0 else None)
        m["batcher"] = self.batcher.metrics()
        m["backend"] = {"name": self.backend.name, "capacity": self.backend.capacity,
                        "busy_s": round(self.backend.busy_s, 6)}
        m["sandboxes"] = {"limit": self.max_sandboxes, "in_use": self.sandboxes_in_use,
                          "peak": self.sandboxes_peak}
        m["policy_versions"] = self.versions.metrics()
        return m

    # -- internals --------------------------------------------------------------------
    def _fill(self) -> None:
        if self._changed is None:
            return  # not started: start() fills
        loop = asyncio.get_running_loop()
        starts: list[_InlineEpisode] | None = None
        while (spec := self.core.next_episode()) is not None:
            if spec.domain in self._by_callback:
                ep = _InlineEpisode(spec)
                self._inline.add(ep)
                if starts is None:
                    # where their tasks' first steps would run, in launch order, after what is
                    # already scheduled: one call for all of them
                    starts = []
                    handle = loop.call_soon(self._inline_start_all, starts)
                starts.append(ep)
                ep.started = handle
                continue
            task = loop.create_task(self._episode(spec), name=f"episode {spec.key}")
            self._tasks.add(task)
            task.add_done_callback(functools.partial(self._task_done, spec))
        at = self.core.next_retry_at()
        if at is not None and at < self._timer_at:
            if self._timer is not None:
                self._timer.cancel()
            self._timer_at = at
            self._timer = loop.call_later(max(0.0, at - self.clock()), self._on_timer)
        self._changed.set()

    def _on_timer(self) -> None:
        self._timer, self._timer_at = None, float("inf")
        self._fill()

    def _task_done(self, spec: EpisodeSpec, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            # counted here, not in the coroutine: a task cancelled before its first step never
            # runs any of its code
            self.core.episode_abandoned(spec)
        elif (error := task.exception()) is not None:
            self._fail(error)  # a bug in the scheduler itself: surface it

    async def _episode(self, spec: EpisodeSpec) -> None:
        usage = Usage()
        if spec.domain in self._sandboxed:
            assert self._sandbox_slots is not None
            async with self._sandbox_slots:  # waits here, before its sandbox exists
                self.sandboxes_in_use += 1
                self.sandboxes_peak = max(self.sandboxes_peak, self.sandboxes_in_use)
                try:
                    result = await self._run(spec, usage)
                finally:
                    self.sandboxes_in_use -= 1
        else:
            result = await self._run(spec, usage)
        self._finished(spec, result, usage)

    def _finished(self, spec: EpisodeSpec, result: EpisodeResult, usage: Usage) -> None:
        traj = result.trajectory
        if not traj.tokenizer_hash:
            traj.tokenizer_hash = self.policy.version.tokenizer_hash
        self.versions.record(spec.policy_version, traj.status == "infra_error")
        self.core.episode_finished(spec, result, usage)
        self._fill()

    # -- light episodes without a task (what `_episode`/`_run` do, step by step) -------------
    def _inline_start_all(self, eps: list[_InlineEpisode]) -> None:
        for ep in eps:
            if ep in self._inline:  # else abandoned by `close` before it started
                self._inline_start(ep)

    def _inline_start(self, ep: _InlineEpisode) -> None:
        ep.started = None
        try:
            ep.run_spec = self._with_task(ep.spec)
            assert isinstance(self.backend, LocalBackend)  # `_by_callback` is empty otherwise
            ep.driver, step = self.backend.start_inline(ep.run_spec)
            ep.usage.sandbox_s += step[2]
            ep.priority = self._priority(ep.run_spec)
        except Exception as e:  # noqa: BLE001 - as in `_run`: an infrastructure failure
            step = (None, _infra_result(ep.run_spec, e), 0.0)
        self._inline_step(ep, step)

    def _inline_step(self, ep: _InlineEpisode, step: Step) -> None:
        """Ask for the next completion, or finish the episode."""
        try:
            request, result, _ = step
            if request is not None:
                try:
                    fut = self.batcher.submit(request, ep.priority)
                except Exception as e:  # noqa: BLE001 - as in `_run`
                    result = _infra_result(ep.run_spec, e)
                else:
                    fut.add_done_callback(functools.partial(self._inline_completion, ep))
                    return
            if result is None:
                result = _infra_result(ep.run_spec, RuntimeError(
                    f"backend {self.backend.name} ended episode {ep.spec.key} without its result"))
            self._inline.discard(ep)
            self._finished(ep.spec, result, ep.usage)
        except BaseException as e:  # noqa: BLE001 - a bug in the scheduler itself: surface it
            self._fail(e)

    def _inline_completion(self, ep: _InlineEpisode, fut: asyncio.Future) -> None:
        if ep not in self._inline:
            return  # abandoned by `close`
        if fut.cancelled():  # as a task cancelled while it awaited its completion
            self._inline.discard(ep)
            self.core.episode_abandoned(ep.spec)
            return
        try:
            completion, gen_s, tokens = fut.result()
            ep.usage.gen_s += gen_s
            ep.usage.tokens += tokens
            assert isinstance(self.backend, LocalBackend)
            step = self.backend.advance_inline(ep.driver, completion)
            ep.usage.sandbox_s += step[2]
        except Exception as e:  # noqa: BLE001 - as in `_run`
            self.backend.discard(ep.driver)
            step = (None, _infra_result(ep.run_spec, e), 0.0)
        self._inline_step(ep, step)

    def _fail(self, error: BaseException) -> None:
        if self._error is None:
            self._error = error
            if self._changed is not None:
                self._changed.set()

    async def _run(self, spec: EpisodeSpec, usage: Usage) -> EpisodeResult:
        handle = None
        try:
            spec = self._with_task(spec)
            # no deadline (the default): no timeout context, whose set-up costs more than a
            # light episode's bookkeeping
            timeout_s = self.config.retry.episode_timeout_s
            async with asyncio.timeout(timeout_s) if timeout_s is not None else _NO_DEADLINE:
                inline = spec.domain in self._light
                handle, (request, result, secs) = await self.backend.start(spec, inline)
                usage.sandbox_s += secs
                priority = self._priority(spec)
                while request is not None:
                    completion, gen_s, tokens = await self.batcher.generate(request, priority)
                    usage.gen_s += gen_s
                    usage.tokens += tokens
                    request, result, secs = await self.backend.advance(handle, completion, inline)
                    usage.sandbox_s += secs
                if result is None:
                    raise RuntimeError(f"backend {self.backend.name} ended episode {spec.key} "
                                       "without its result")
                return result
        except TimeoutError:
            self.backend.discard(handle)
            return _infra_result(spec, EpisodeTimeout(
                f"episode {spec.key} ran past {self.config.retry.episode_timeout_s}s"))
        except Exception as e:  # noqa: BLE001 - a driver that raises is an infrastructure failure
            self.backend.discard(handle)
            return _infra_result(spec, e)

    def _with_task(self, spec: EpisodeSpec) -> EpisodeSpec:
        """`spec` with its group's task, resolved at the group's first launch (and the group's
        script handed to a scripted policy then)."""
        if self.tasks is None or spec.task is not None:
            return spec
        g = self.core.groups.get(spec.group_id)
        task = g.task if g is not None else None
        if task is None:
            task = self.tasks.task_for(spec)
            if g is not None:
                g.task = task
            if self._scripted is not None:
                try:
                    self._scripted.assign(spec.group_id, {role: self.tasks.script_for(spec, task, role)
                                                          for role in self._scripted.roles})
                except Exception as e:  # noqa: BLE001 - that group's requests fail, not the run
                    self._scripted.refuse(spec.group_id, f"{type(e).__name__}: {e}")
        return EpisodeSpec._make((*spec[:-1], task))  # `_replace(task=...)`, without its keyword plumbing

    def _priority(self, spec: EpisodeSpec) -> tuple[int, int]:
        """Generation order under contention: higher tiers, then older groups."""
        g = self.core.groups.get(spec.group_id)
        return self._tier_rank[spec.tier], (g.seq if g is not None else 1 << 62)

    async def _wait_change(self) -> None:
        assert self._changed is not None  # made when the run starts
        self._changed.clear()
        await self._changed.wait()

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"the scheduler failed: {type(self._error).__name__}: {self._error}") \
                from self._error


class _InlineEpisode:
    """A light episode driven by callbacks: its spec, what it used, where it is."""

    __slots__ = ("spec", "run_spec", "usage", "driver", "priority", "started")

    def __init__(self, spec: EpisodeSpec) -> None:
        self.spec = self.run_spec = spec
        """as launched; `run_spec` carries the group's task once resolved"""
        self.usage = Usage()
        self.driver: Any = None
        self.priority: tuple[int, int] = (0, 0)
        self.started: asyncio.Handle | None = None
        """the scheduled call that starts it (and the others launched with it), until it runs"""


def _infra_result(spec: EpisodeSpec, exc: BaseException) -> EpisodeResult:
    """The record of an episode whose driver raised or timed out, against its own task (known
    from the spec; without one, the key is rebuilt from the spec and the hash left empty)."""
    task = spec.task
    traj = Trajectory(task_key=task.key if task else f"{spec.domain}/{spec.split}/{spec.task_seed}",
                      task_hash=task.hash if task else "", domain=spec.domain,
                      split=task.split if task else spec.split, policy_version=spec.policy_version,
                      status="infra_error", error=ErrorInfo.from_exception(exc, "runner"),
                      seed=task.seed if task else spec.task_seed,
                      sampling={"seed": spec.sampling_seed}, group_id=spec.group_id,
                      attempt=spec.attempt, created_at=time.time())
    return EpisodeResult(traj, task, None)
