"""The synchronous batched runner: many episodes in lockstep, one `generate` call per turn.

Every turn, the requests of all active episodes go to the policy as one batch; the environment
steps then run on a thread pool (they wait on sandbox processes, so threads overlap them). This is
the simple driver for evaluation and tests; the async scheduler (`posttrain.scheduling`) drives the
same `Episode` objects with continuous batching.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Sequence

from posttrain.envs import EnvConfig
from posttrain.envs.vision import for_policy
from posttrain.envs.single import SandboxFactory
from posttrain.values.generation import Completion, GenerationRequest, SamplingParams
from posttrain.policies.base import Policy, PolicyError
from posttrain.rollout.episode import Episode
from posttrain.values.trajectory import Trajectory
from posttrain.tasks.domain import Domain
from posttrain.values.task import Task


@dataclass(frozen=True)
class EpisodeSpec:
    domain: Domain
    task: Task
    group_id: str = ""
    attempt: int = 0


def _generate(policy: Policy, requests: list[GenerationRequest]) -> list[Completion]:
    try:
        completions = policy.generate(requests)
        if len(completions) != len(requests):
            raise PolicyError(f"policy returned {len(completions)} completions for {len(requests)} requests")
        return completions
    except Exception as e:  # noqa: BLE001 - the backend failing is infrastructure, per episode
        message = f"{type(e).__name__}: {e}"
        return [Completion(text="", finish_reason="error", error=message) for _ in requests]


def run_episodes(items: Sequence[EpisodeSpec | tuple[Domain, Task]], policy: Policy,
                 sampling: SamplingParams = SamplingParams(), *, env_config: EnvConfig = EnvConfig(),
                 sandbox_factory: SandboxFactory | None = None, workers: int = 2, run_id: str = "",
                 on_done: Callable[[Episode], None] | None = None) -> list[Trajectory]:
    """Run every episode to the end; returns their trajectories in the order of `items`.

    `on_done(episode)` is called as each episode finishes (e.g. to store it with its workspace)."""
    specs = [it if isinstance(it, EpisodeSpec) else EpisodeSpec(*it) for it in items]
    # a text-only policy gets image domains' textual fallbacks, or a refusal naming the domains
    env_config = for_policy(env_config, policy, list({s.domain.name: s.domain for s in specs}.values()))
    episodes = [Episode(s.domain, s.task, policy_version=policy.version.name, sampling=sampling,
                        env_config=env_config, sandbox_factory=sandbox_factory, group_id=s.group_id,
                        attempt=s.attempt, run_id=run_id) for s in specs]
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        pending = dict(zip(range(len(episodes)), pool.map(lambda ep: ep.start(), episodes)))
        for i, ep in enumerate(episodes):
            if ep.done and on_done:
                on_done(ep)
        while True:
            active = [(i, r) for i, r in pending.items() if r is not None]
            if not active:
                break
            completions = _generate(policy, [r for _, r in active])
            nexts = pool.map(lambda pair: episodes[pair[0]].advance(pair[1]),
                             [(i, c) for (i, _), c in zip(active, completions)])
            for (i, _), nxt in zip(active, nexts):
                pending[i] = nxt
                if nxt is None and on_done:
                    on_done(episodes[i])
    return [ep.result() for ep in episodes]
