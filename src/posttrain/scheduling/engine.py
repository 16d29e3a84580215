"""Fixed workloads on the one episode engine: run a given set of episodes, get their results.

    from posttrain.scheduling.engine import WorkItem, run_workload
    attempts = run_workload([WorkItem(domain, task, "eval:ab12:0"), ...], policy, retries=2,
                            on_result=lambda r: store.put_episode(r))
    attempts[i]      # every attempt of item i, in order: EpisodeResult(trajectory, task, workspace)

Evaluation, `posttrain rollout`, the domain self-check and training scripts are such workloads:
a set of (domain, task) items and what to do with each finished result. They run on the same
`Scheduler` as training (`posttrain.scheduling.runner`), with its continuous batching of
generation, its worker backend, its retries and its bound on live sandboxes, so a workload never
has more sandboxes alive than it has workers however many episodes it holds.

Each item is one episode, run as a group of one under the item's group id (a workload's own
identity, e.g. 'eval:<task hash>:<sample>', which reaches the trajectory, the store and the
per-sample seeds of `posttrain.evaluation.policy.SeededPolicy`). Items may share a group id (the
G members of a GRPO group): each still runs on its own, so a failed member never discards the
others, and its trajectory carries the shared id. An `infra_error` is retried (a fresh episode,
`attempt + 1`) up to `retries` times, except a prompt that does not fit the model
(`ErrorInfo.retryable`). The sampling settings are used as given (a workload that wants seeded
samples seeds them itself); quarantine and the policy-outage stop are training's business and
are off here: a workload reports every attempt, it does not give up on a domain.

This is also the one place that opens the sandbox pool for episodes (`sandbox_pool`).
"""

from __future__ import annotations

import asyncio
import gc
import threading
import weakref
from collections.abc import Callable, Coroutine, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from posttrain.envs import EnvConfig, needs_sandbox, sandbox_preload
from posttrain.envs.single import SandboxFactory
from posttrain.envs.vision import for_policy
from posttrain.errors import Unavailable
from posttrain.policies.base import Policy, ScriptedPlayer
from posttrain.scheduling.config import BatchConfig, DomainSpec, QuarantineConfig, RetryConfig, SchedulerConfig
from posttrain.scheduling.episodes import RolloutEpisodeFactory
from posttrain.scheduling.runner import Scheduler
from posttrain.scheduling.work import EpisodeDriver, EpisodeFactory, EpisodeSpec, Group
from posttrain.tasks.domain import Domain
from posttrain.values.episode import EpisodeResult
from posttrain.values.generation import SamplingParams
from posttrain.values.task import Task
from posttrain.values.trajectory import Trajectory

MAX_IN_FLIGHT = 1024
"""episodes of non-sandboxed domains in flight at once (their requests batch together: one
`generate` call can carry them all); sandboxed ones are bounded by the workers"""


@dataclass(frozen=True)
class WorkItem:
    """One episode of a workload."""

    domain: Domain
    task: Task
    group_id: str = ""
    """the workload's identity of the episode's group; '' for none (the engine then runs it
    under '<domain>#<item index>', recorded as '')"""
    episode: EpisodeFactory | None = None
    """builds this item's episode from its spec instead of the workload's factory (one sampling,
    env config and sandbox factory for all): a replay's recorded settings, say"""


@contextmanager
def _unavailable() -> Iterator[None]:
    """A sandbox that cannot start here is the machine's lack, said in one line by the CLI
    (`errors.Unavailable`: the sandbox package imports nothing of the project, so it cannot say
    so itself)."""
    from posttrain.sandbox import SandboxUnavailable

    try:
        yield
    except SandboxUnavailable as e:
        raise Unavailable(str(e)) from e


def check_sandbox(domains: Sequence[Domain]) -> None:
    """Raise `errors.Unavailable` (naming what to install) when any of `domains` needs a sandbox
    and none can start here: before a run's checks and evaluations, not at its first episode."""
    if any(needs_sandbox(d) for d in domains):
        from posttrain.sandbox.factory import check_available

        with _unavailable():
            check_available()


@contextmanager
def sandbox_pool(domains: Sequence[Domain], size: int) -> Iterator[SandboxFactory | None]:
    """A warm pool of `size` sandboxes, preloaded for `domains`, when any of them needs one (else
    None): the sandbox factory every episode of a run takes its sandbox from."""
    if not any(needs_sandbox(d) for d in domains):
        yield None
        return
    from posttrain.sandbox import SandboxPool

    with _unavailable():
        pool = SandboxPool(size=size, preload=sandbox_preload(list({d.name: d for d in domains}.values())))
    with pool:
        yield pool.sandbox


def run_workload(items: Sequence[WorkItem | tuple[Domain, Task]], policy: Policy,
                 sampling: SamplingParams = SamplingParams(), *, env_config: EnvConfig = EnvConfig(),
                 sandbox_factory: SandboxFactory | None = None, workers: int = 2, run_id: str = "",
                 retries: int = 0, max_sandboxes: int | None = None, player: ScriptedPlayer | None = None,
                 on_result: Callable[[EpisodeResult], None] | None = None) -> list[list[EpisodeResult]]:
    """Run every item to the end (retrying infrastructure failures `retries` times); returns
    every attempt of each item, in item order. `on_result(result)` sees each attempt as it ends
    (e.g. to store it with its task and workspace). Without a `sandbox_factory`, a pool of
    `workers` sandboxes is opened for the run when a domain needs one. Live sandboxes never
    exceed `max_sandboxes` (default: `workers`). `player`: the scripted policy `policy` wraps,
    if any (it is handed each item's scripts)."""
    if not items:
        return []
    work = [it if isinstance(it, WorkItem) else WorkItem(*it) for it in items]
    with old_objects_frozen():
        if sandbox_factory is None:
            # an item that builds its own episode brings its own sandboxes
            with sandbox_pool([w.domain for w in work if w.episode is None], max(1, workers)) as pooled:
                return _run_sync(_run(work, policy, sampling, env_config, pooled, workers, run_id, retries,
                                      max_sandboxes, player, on_result))
        return _run_sync(_run(work, policy, sampling, env_config, sandbox_factory, workers, run_id,
                              retries, max_sandboxes, player, on_result))


_frozen_depth = 0
_frozen_lock = threading.Lock()


@contextmanager
def old_objects_frozen() -> Iterator[None]:
    """Leave the objects alive now (modules, domains, a workload's tasks: long-lived) out of the
    garbage collector's scans until the block ends (`gc.freeze`, given back by `gc.unfreeze`).
    A workload of light episodes allocates enough to trigger a full collection, which would walk
    the whole heap again: that was a sixth of an oracle episode's CPU. Garbage is still freed by
    reference counting at once; only cycles among the old objects wait for the block's end.
    Nested and concurrent blocks share one freeze: the last to end gives the objects back."""
    global _frozen_depth
    with _frozen_lock:
        _frozen_depth += 1
        if _frozen_depth == 1:
            gc.freeze()
    try:
        yield
    finally:
        with _frozen_lock:
            _frozen_depth -= 1
            if _frozen_depth == 0:
                gc.unfreeze()


def run_episodes(items: Sequence[WorkItem | tuple[Domain, Task]], policy: Policy,
                 sampling: SamplingParams = SamplingParams(), *, env_config: EnvConfig = EnvConfig(),
                 sandbox_factory: SandboxFactory | None = None, workers: int = 2, run_id: str = "",
                 on_result: Callable[[EpisodeResult], None] | None = None) -> list[Trajectory]:
    """One attempt per item, no retries: the trajectories in item order."""
    return [attempts[-1].trajectory for attempts in run_workload(
        items, policy, sampling, env_config=env_config, sandbox_factory=sandbox_factory, workers=workers,
        run_id=run_id, on_result=on_result)]


async def _run(work: list[WorkItem], policy: Policy, sampling: SamplingParams, env_config: EnvConfig,
               sandbox_factory: SandboxFactory | None, workers: int, run_id: str, retries: int,
               max_sandboxes: int | None, player: ScriptedPlayer | None,
               on_result: Callable[[EpisodeResult], None] | None) -> list[list[EpisodeResult]]:
    domains = {w.domain.name: w.domain for w in work}
    # a text-only policy gets image domains' textual fallbacks, or a refusal naming the domains
    env_config = for_policy(env_config, policy, list(domains.values()))
    gids: list[str] = []
    seen: dict[str, int] = {}
    for i, w in enumerate(work):
        gid = w.group_id or f"{w.domain.name}#{i}"
        n = seen[gid] = seen.get(gid, -1) + 1
        gids.append(gid if n == 0 else f"{gid}/{n}")  # one engine group per episode
    if len(set(gids)) != len(gids):
        raise ValueError("run_workload: group ids collide after numbering shared ones; "
                         "give distinct group ids")
    index = {gid: i for i, gid in enumerate(gids)}
    attempts: list[list[EpisodeResult]] = [[] for _ in work]

    def record(result: EpisodeResult) -> None:
        i = index[result.trajectory.group_id]
        # the workload's own id, shared or not; '' stays '' (an ungrouped episode: the engine's
        # internal '<domain>#<index>' is no identity across calls, and must not become one in a store)
        result.trajectory.group_id = work[i].group_id
        attempts[i].append(result)
        if on_result is not None:
            on_result(result)

    def on_group(group: Group) -> None:
        for r in group.results:
            record(r)
        # handed over (and forgotten by the core) now rather than at the end, so a finished
        # group's bookkeeping is freed at once instead of living on, scanned by every garbage
        # collection, until the last episode of the workload (a weak reference: the core holds
        # this callback, and a cycle would keep the whole workload alive until a full collection)
        core = core_ref()
        if core is not None:
            core.take_ready("work")

    factory = RolloutEpisodeFactory(domains, sampling=sampling, env_config=env_config,
                                    sandbox_factory=sandbox_factory, run_id=run_id, seed_sampling=False,
                                    tasks={gid: w.task for gid, w in zip(gids, work)})
    own = {gid: w.episode for gid, w in zip(gids, work) if w.episode is not None}

    def episodes(spec: EpisodeSpec) -> EpisodeDriver:
        build = own.get(spec.group_id)
        return build(spec) if build is not None else factory(spec)

    in_flight = max(1, min(len(work), MAX_IN_FLIGHT))
    config = SchedulerConfig(
        # the trainer tier stays empty: no staleness bound, no adaptive retiring of a domain
        group_size=1, tiers=("work", "train"), trainer_tier="train", max_running=in_flight,
        max_sandboxes=max_sandboxes or max(1, workers), max_staleness=None, starvation_s=None,
        retry=RetryConfig(max_retries=retries, backoff_s=0.0, jitter=0.0, policy_outage_s=None),
        quarantine=QuarantineConfig(max_error_rate=1.0),  # never: every attempt is reported
        batch=BatchConfig(max_batch=in_flight))
    sandboxed = {name: needs_sandbox(d) for name, d in domains.items()}
    specs = [DomainSpec(name, tier="work", continuous=False, sandboxed=sandboxed[name], light=not sandboxed[name])
             for name in domains]
    sched = Scheduler(config, specs, policy, factory=episodes if own else factory, tasks=factory,
                      workers=max(1, workers), on_group=on_group, on_failure=record,
                      version_name=policy.version.name, player=player)
    core_ref = weakref.ref(sched.core)
    async with sched:
        by_domain: dict[str, list[str]] = {}
        for gid, w in zip(gids, work):
            by_domain.setdefault(w.domain.name, []).append(gid)
        for name, ids in by_domain.items():
            sched.submit(name, group_ids=ids)
        await sched.wait_finished()
        sched.core.take_ready("work")  # hand over (and forget) what is left
    return attempts


def _run_sync(coro: Coroutine[Any, Any, list[list[EpisodeResult]]]) -> list[list[EpisodeResult]]:
    """Run the workload's event loop; from inside a running loop (an async caller), on a thread
    of its own, since a loop cannot be nested."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    out: dict[str, Any] = {}

    def target() -> None:
        try:
            out["value"] = asyncio.run(coro)
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            out["error"] = e

    t = threading.Thread(target=target, name="posttrain-workload")
    t.start()
    t.join()
    if "error" in out:
        raise out["error"]
    return out["value"]
