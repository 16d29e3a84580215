"""Environments: single-answer and multi-turn tool use, over model text (see `base.py`)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from posttrain.envs.base import Environment, Observation, StepResult
from posttrain.envs.budget import EnvConfig
from posttrain.envs.single import SandboxFactory, SingleAnswerEnv, render_files
from posttrain.envs.tools import ToolEnv, tools_intro
from posttrain.sandbox.base import Sandbox
from posttrain.tasks.domain import Domain
from posttrain.values.task import Task
from posttrain.values.verdict import Verdict

__all__ = ["EnvConfig", "Environment", "Observation", "SingleAnswerEnv", "StepResult", "ToolEnv",
           "default_sandbox_factory", "initial_observation", "make_env", "play_actions", "sandbox_preload",
           "stop_strings"]


def default_sandbox_factory() -> SandboxFactory:
    """A fresh default sandbox per episode (`posttrain.sandbox.open_sandbox`)."""
    from posttrain.sandbox import open_sandbox

    return lambda: open_sandbox()


def initial_observation(domain: Domain, task: Task, config: EnvConfig = EnvConfig()) -> str:
    """The text of the first observation an episode of `task` shows the policy, without opening
    a sandbox (e.g. to check before a run that every domain's prompts fit the model's context)."""
    if domain.env == "tools":
        return tools_intro(domain, task)
    files, _ = render_files(task, config.show_files_in_prompt_chars)
    return task.prompt + files


def make_env(domain: Domain, config: EnvConfig = EnvConfig(),
             sandbox_factory: SandboxFactory | None = None) -> SingleAnswerEnv | ToolEnv:
    if domain.env == "tools":
        return ToolEnv(domain, config, sandbox_factory or default_sandbox_factory())
    needs = domain.verifier.needs_sandbox
    return SingleAnswerEnv(domain, config, sandbox_factory or (default_sandbox_factory() if needs else None))


def sandbox_preload(domains: Sequence[Domain]) -> tuple[str, ...]:
    """The modules a sandbox pool serving `domains` should preload (the union, sorted)."""
    return tuple(sorted({m for d in domains for m in d.preload}))


def stop_strings(domain: Domain) -> tuple[str, ...]:
    if domain.stop is not None:
        return domain.stop
    return ToolEnv.default_stop if domain.env == "tools" else SingleAnswerEnv.default_stop


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
        result = None
        for action in actions:
            result = env.step(action)
            if result.terminated or result.truncated:
                break
        if result is None or not (result.terminated or result.truncated):
            result = env.finish(None, truncated=True)
        assert result.verdict is not None
        return result.verdict
    finally:
        env.close()
