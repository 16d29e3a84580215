"""Real episodes for the scheduler: an `EpisodeSpec` becomes a `posttrain.rollout.episode.Episode`.

The group's task is `domain.task(spec.task_seed, spec.split)`, the same for every member; each
member samples with its own seed (`spec.seed`) so the G members of a group differ. Domains are
looked up by name, in a mapping or the registry; with the Ray backend the factory is pickled to
each actor, so give it a lookup that works there (the registry, or a mapping of importable
domains).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace

from posttrain.envs import EnvConfig
from posttrain.envs.single import SandboxFactory
from posttrain.rollout.episode import Episode
from posttrain.scheduling.work import EpisodeSpec
from posttrain.tasks.domain import Domain
from posttrain.values.generation import SamplingParams


class RolloutEpisodeFactory:
    def __init__(self, domains: Mapping[str, Domain] | Callable[[str], Domain] | None = None, *,
                 sampling: SamplingParams = SamplingParams(), env_config: EnvConfig = EnvConfig(),
                 sandbox_factory: SandboxFactory | None = None, run_id: str = "",
                 seed_sampling: bool = True) -> None:
        """`domains`: a mapping or a lookup function by name (None: the registry).
        `seed_sampling`: give each episode its own `sampling.seed` (from `EpisodeSpec.seed`)."""
        self.domains = domains
        self.sampling, self.env_config = sampling, env_config
        self.sandbox_factory, self.run_id = sandbox_factory, run_id
        self.seed_sampling = seed_sampling

    def _domain(self, name: str) -> Domain:
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

    def __call__(self, spec: EpisodeSpec) -> Episode:
        domain = self._domain(spec.domain)
        task = domain.task(spec.task_seed, spec.split)  # type: ignore[arg-type]
        sampling = replace(self.sampling, seed=spec.seed) if self.seed_sampling else self.sampling
        return Episode(domain, task, policy_version=spec.policy_version, sampling=sampling,
                       env_config=self.env_config, sandbox_factory=self.sandbox_factory,
                       group_id=spec.group_id, attempt=spec.attempt, run_id=self.run_id)
