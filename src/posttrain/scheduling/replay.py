"""Replay stored trajectories as a workload on the one episode engine.

Each trajectory becomes one `WorkItem` whose episode is built with what the recording used: its
sampling, its env config (text-only when a vision domain was played without images), a sandbox
on its recorded clock with its domain's preloads, its policy version, and the observations its
context policy dropped, turn by turn. One routing policy answers every request from the stored
completions of the episode it belongs to (`posttrain.rollout.replay._ReplayPolicy`, found by the
group id the engine gave the episode), so the engine's batching may mix episodes freely. The
comparison of recording and replay is `posttrain.rollout.replay._compare`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import replace

from posttrain.envs import EnvConfig, default_sandbox_factory
from posttrain.envs.single import SandboxFactory
from posttrain.rollout.episode import Episode
from posttrain.rollout.replay import (
    ReplayInfraError,
    ReplayResult,
    _compare,
    _ReplayPolicy,
    recorded_clock,
    timing_dependent,
)
from posttrain.scheduling.engine import WorkItem, run_workload
from posttrain.scheduling.work import EpisodeSpec
from posttrain.storage.store import Store
from posttrain.tasks.registry import get_domain
from posttrain.values.generation import Completion, GenerationRequest, PolicyVersion, SamplingParams
from posttrain.values.trajectory import Trajectory

Render = Callable[[GenerationRequest], list[int] | None]


class _RoutedReplay:
    """The workload's one policy: each request is answered by its own episode's `_ReplayPolicy`,
    registered under the engine's group id when the episode is built (before its first request)."""

    def __init__(self) -> None:
        self.routes: dict[str, _ReplayPolicy] = {}
        self._lock = threading.Lock()  # episodes are built on the engine's worker threads
        self.version = PolicyVersion(name="replay")
        self.max_positions: int | None = None
        """the recorded completions already carry the context's verdict (`out_of_context`)"""
        self.accepts_images = True
        """images are re-rendered (and compared) whenever the recorded episode showed them"""

    def route(self, group_id: str, policy: _ReplayPolicy) -> None:
        with self._lock:
            self.routes[group_id] = policy

    def render(self, request: GenerationRequest) -> None:
        return None  # replays stored token ids; it has no tokenizer

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        with self._lock:
            routes = dict(self.routes)
        return [routes[str(req.meta["group_id"])].generate([req])[0] for req in requests]


def replay_many(store: Store, trajs: Sequence[Trajectory], *, env_config: EnvConfig = EnvConfig(),
                sandbox_factory: SandboxFactory | None = None,
                sandbox_for: Callable[[Trajectory], SandboxFactory] | None = None,
                render: Render | None = None, workers: int = 1) -> list[ReplayResult]:
    """Replay every trajectory on the engine and compare; results in the order given.
    `sandbox_factory`: one for all; `sandbox_for`: one per trajectory (e.g. a pool on its
    recorded clock); neither: a fresh sandbox on each one's recorded clock. `render`: a policy's
    `render` (its tokenizer); the replayed prompts' ids must then equal the recorded
    `Turn.prompt_token_ids`.
    Raises `ReplayInfraError` for the first trajectory, in order, whose replay failed on
    infrastructure (no comparison is made then)."""
    policy = _RoutedReplay()
    items: list[WorkItem] = []
    replayed: dict[int, tuple[int, _ReplayPolicy]] = {}  # trajectory -> its item, its policy
    for i, traj in enumerate(trajs):
        if traj.status == "infra_error":
            continue
        replayed[i] = (len(items), _policy_for(traj, render))
        items.append(_item(store, traj, replayed[i][1], policy, env_config,
                           sandbox_for(traj) if sandbox_for is not None else sandbox_factory))
    attempts = run_workload(items, policy, workers=workers) if items else []
    results = []
    for i, traj in enumerate(trajs):
        if i not in replayed:
            results.append(ReplayResult(traj.id, False, {"turn": None, "field": "status",
                                                         "stored": "infra_error", "replayed": "not replayable"}))
            continue
        item, own = replayed[i]
        results.append(_result(traj, attempts[item][-1].trajectory, own))
    return results


def replay(store: Store, traj: Trajectory, *, env_config: EnvConfig = EnvConfig(),
           sandbox_factory: SandboxFactory | None = None, render: Render | None = None) -> ReplayResult:
    """One trajectory's replay (see `replay_many`)."""
    return replay_many(store, [traj], env_config=env_config, sandbox_factory=sandbox_factory,
                       render=render)[0]


def _policy_for(traj: Trajectory, render: Render | None) -> _ReplayPolicy:
    return _ReplayPolicy(traj.turns, traj.policy_version, out_of_context=traj.status == "truncated"
                         and bool(traj.counters.get("context_budget_exhausted")), render=render)


def _item(store: Store, traj: Trajectory, own: _ReplayPolicy, policy: _RoutedReplay, env_config: EnvConfig,
          sandbox_factory: SandboxFactory | None) -> WorkItem:
    domain = get_domain(traj.domain)
    task = store.get_task(traj.task_hash)
    sampling = SamplingParams(**{**traj.sampling, "stop": tuple(traj.sampling.get("stop", ()))})
    if domain.needs_vision and not any(t.observation_images for t in traj.turns):
        env_config = replace(env_config, text_only=True)  # recorded with a text-only policy
    # without one given, a fresh sandbox on the recorded clock
    factory = sandbox_factory or default_sandbox_factory([domain], clock=recorded_clock(traj))
    # a context policy's drops are replayed as recorded: the same prompts, whatever the estimates
    drops = {t.index: t.dropped_observations for t in traj.turns}

    def build(spec: EpisodeSpec) -> Episode:
        policy.route(spec.group_id, own)
        return Episode(domain, task, policy_version=traj.policy_version, sampling=sampling,
                       env_config=env_config, sandbox_factory=factory, group_id=spec.group_id,
                       attempt=spec.attempt, recorded_drops=drops)

    return WorkItem(domain, task, episode=build)


def _result(traj: Trajectory, new: Trajectory, own: _ReplayPolicy) -> ReplayResult:
    if new.status == "infra_error":
        assert new.error is not None
        raise ReplayInfraError(f"replay of {traj.id} failed on infrastructure: {new.error.type}: "
                               f"{new.error.message}")
    timing = timing_dependent(traj)
    if traj.sandbox and new.sandbox and recorded_clock(traj) != new.sandbox.get("clock"):
        return ReplayResult(traj.id, False, {"turn": None, "field": "clock", "stored": recorded_clock(traj),
                                             "replayed": new.sandbox.get("clock")}, timing=timing)
    result = _compare(traj, new, own.rendered)
    result.timing = timing
    return result
