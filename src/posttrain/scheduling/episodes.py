"""Real episodes for the engine: an `EpisodeSpec` becomes a `posttrain.rollout.episode.Episode`.

The factory is also the engine's `TaskSource`: the group's task is resolved once, in the engine's
process, as `domain.task(spec.task_seed, spec.split)` (or taken from an explicit workload's
`tasks`, by group id), and travels in `EpisodeSpec.task` to every member and on to the store.
Each member samples with its own seed (`spec.sampling_seed`) so the G members of a group differ.
Domains are looked up by name, in a mapping or the registry; with the Ray backend the factory is
pickled to each actor, so give it a lookup that works there (the registry, or a mapping of
importable domains).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from posttrain.envs import EnvConfig
from posttrain.envs.single import SandboxFactory
from posttrain.rollout.episode import Episode
from posttrain.scheduling.scripts import script_for
from posttrain.scheduling.work import EpisodeSpec
from posttrain.tasks.domain import Domain
from posttrain.values.generation import SamplingParams
from posttrain.values.task import Task


class RolloutEpisodeFactory:
    def __init__(self, domains: Mapping[str, Domain] | Callable[[str], Domain] | None = None, *,
                 sampling: SamplingParams = SamplingParams(), env_config: EnvConfig = EnvConfig(),
                 sandbox_factory: SandboxFactory | None = None, run_id: str = "",
                 seed_sampling: bool = True, tasks: Mapping[str, Task] | None = None) -> None:
        """`domains`: a mapping or a lookup function by name (None: the registry).
        `seed_sampling`: give each episode its own `sampling.seed` (from `EpisodeSpec.sampling_seed`).
        `tasks`: explicit tasks by group id (an evaluation set, a file of tasks); groups not in
        it draw theirs from the domain by seed."""
        self.domains = domains
        self.sampling, self.env_config = sampling, env_config
        self.sandbox_factory, self.run_id = sandbox_factory, run_id
        self.seed_sampling = seed_sampling
        self.tasks = tasks or {}

    def domain(self, name: str) -> Domain:
        if self.domains is None:
            from posttrain.tasks.registry import get_domain

            return get_domain(name)
        if callable(self.domains):
            return self.domains(name)
        try:
            return self.domains[name]
        except KeyError:
            raise KeyError(f"RolloutEpisodeFactory: no domain {name!r} in the mapping given "
                           f"({len(self.domains)} domains)") from None

    def task_for(self, spec: EpisodeSpec) -> Task:
        task = self.tasks.get(spec.group_id)
        if task is not None:
            return task
        return self.domain(spec.domain).task(spec.task_seed, spec.split)  # type: ignore[arg-type]

    def script_for(self, spec: EpisodeSpec, task: Task, role: str) -> Sequence[str]:
        return script_for(role, self.domain(spec.domain), task)

    def __call__(self, spec: EpisodeSpec) -> Episode:
        domain = self.domain(spec.domain)
        task = spec.task if spec.task is not None else self.task_for(spec)
        sampling = replace(self.sampling, seed=spec.sampling_seed) if self.seed_sampling else self.sampling
        return Episode(domain, task, policy_version=spec.policy_version, sampling=sampling,
                       env_config=self.env_config, sandbox_factory=self.sandbox_factory,
                       group_id=spec.group_id, attempt=spec.attempt, run_id=self.run_id)
