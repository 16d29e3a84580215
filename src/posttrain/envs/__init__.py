"""Environments: single-answer and multi-turn tool use, over model text (see `base.py`)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from posttrain.envs.base import Environment, EpisodeEnd, Observation, StepResult
from posttrain.envs.budget import EnvConfig
from posttrain.envs.single import SandboxFactory, SingleAnswerEnv
from posttrain.envs.tools import ToolEnv
from posttrain.sandbox.base import DEFAULT_CLOCK, Sandbox
from posttrain.tasks.domain import Domain
from posttrain.values.task import Task
from posttrain.values.verdict import Verdict

__all__ = ["ENV_KINDS", "EnvConfig", "Environment", "EpisodeEnd", "Observation", "SingleAnswerEnv",
           "StepResult", "ToolEnv", "UnknownEnvKind", "default_sandbox_factory", "env_kind",
           "initial_observation", "make_env", "needs_sandbox", "play_actions", "sandbox_preload",
           "stop_strings"]

ENV_KINDS: dict[str, type[SingleAnswerEnv] | type[ToolEnv]] = {"single": SingleAnswerEnv, "tools": ToolEnv}
"""the environment type of each `Domain.env` kind: the one place a kind's name is looked up"""


class UnknownEnvKind(ValueError):
    """A domain names an environment kind that is not registered."""


def env_kind(domain: Domain) -> type[SingleAnswerEnv] | type[ToolEnv]:
    try:
        return ENV_KINDS[domain.env]
    except KeyError:
        raise UnknownEnvKind(f"domain {domain.name}: env {domain.env!r} is not a registered environment "
                             f"kind ({', '.join(sorted(ENV_KINDS))})") from None


def needs_sandbox(domain: Domain) -> bool:
    """Whether an episode of `domain` holds a sandbox (its workspace, or to grade)."""
    return env_kind(domain).needs_sandbox(domain)


def default_sandbox_factory(domains: Sequence[Domain] = (), *,
                            clock: int | None = DEFAULT_CLOCK) -> SandboxFactory:
    """A fresh default sandbox per episode (`posttrain.sandbox.open_sandbox`), preloaded for
    `domains` (a domain's preload may be a module file its tools need, e.g. geometry's API)."""
    from posttrain.sandbox import open_sandbox

    preload = sandbox_preload(domains)
    return lambda: open_sandbox(preload=preload, clock=clock)


def initial_observation(domain: Domain, task: Task, config: EnvConfig = EnvConfig()) -> str:
    """The text of the first observation an episode of `task` shows the policy, without opening
    a sandbox (e.g. to check before a run that every domain's prompts fit the model's context).
    Under `config.text_only` it includes the text that stands in for the domain's images (as
    `vision.with_task_images` appends it): that text is most of a page-image task's prompt."""
    text = env_kind(domain).first_observation(domain, task, config)
    if config.text_only and domain.images is not None and domain.text_fallback is not None:
        text += "\n\n" + domain.text_fallback(task)
    return text


def make_env(domain: Domain, config: EnvConfig = EnvConfig(),
             sandbox_factory: SandboxFactory | None = None) -> Environment:
    kind = env_kind(domain)
    if sandbox_factory is None and kind.needs_sandbox(domain):
        sandbox_factory = default_sandbox_factory([domain])
    return kind(domain, config, sandbox_factory)


def sandbox_preload(domains: Sequence[Domain]) -> tuple[str, ...]:
    """What a sandbox serving `domains` must preload (the union, sorted): modules, and module
    files it must show (see `posttrain.sandbox.insidedir`)."""
    return tuple(sorted({m for d in domains for m in d.preload}))


def stop_strings(domain: Domain) -> tuple[str, ...]:
    if domain.stop is not None:
        return domain.stop
    return env_kind(domain).default_stop


@contextmanager
def _borrowed(sandbox: Sandbox) -> Iterator[Sandbox]:
    yield sandbox  # the caller owns it and closes it


def play_actions(domain: Domain, task: Task, actions: Sequence[str],
                 sandbox: Sandbox | None = None, config: EnvConfig = EnvConfig(), *,
                 sandbox_factory: SandboxFactory | None = None) -> Verdict:
    """Play a fixed list of turns (an oracle, a negative, a replay) and return the verdict.

    The episode runs in `sandbox` (borrowed, not closed), or in one from `sandbox_factory`, or
    in a fresh default sandbox. It is graded even when the actions run out before a submit (as
    a truncated episode would be). Sandbox and verifier failures propagate (infrastructure)."""
    factory = (lambda: _borrowed(sandbox)) if sandbox is not None else sandbox_factory
    env = make_env(domain, config, factory)
    try:
        env.reset(task)
        for action in actions:
            result = env.step(action)
            if result.end is not None:
                return result.end.verdict
        return env.finish(None, truncated=True).verdict
    finally:
        env.close()
