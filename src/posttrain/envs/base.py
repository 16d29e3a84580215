"""The environment contract, Gymnasium-style, over model text.

    obs = env.reset(task)                 # what the policy sees first
    while True:
        result = env.step(action_text)    # one policy turn
        if result.terminated or result.truncated:
            break

`terminated` means the task ended on its own terms (an answer was submitted); `truncated` means a
budget ran out first (turns, tokens, time). A tool that fails, an action that cannot be parsed or
an unknown tool is *not* an error of the episode: it comes back as an observation that says so,
and the event is counted in `info`. Only infrastructure failures (the sandbox died) raise, as
`posttrain.sandbox.base.SandboxError`.

Action format (documented for users in the README): see `posttrain.envs.actions`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from posttrain.values.image import Image

if TYPE_CHECKING:
    from posttrain.values.task import Task
    from posttrain.values.verdict import Verdict


@dataclass(frozen=True)
class Observation:
    text: str
    """what the policy reads next (the prompt on reset, tool results after a step)"""
    truncated_chars: int = 0
    """characters cut from this observation by the context budget (0 when nothing was cut)"""
    images: tuple[Image, ...] = ()
    """images shown after the text (a rendered chart, page or view of the model)"""


@dataclass
class StepResult:
    observation: Observation
    reward: float | None
    """set when the episode ends (the verdict's score); None before"""
    terminated: bool
    truncated: bool
    info: dict[str, Any] = field(default_factory=dict)
    """per-step facts: parsed tool calls, tool results, parse errors, timings, snapshot id"""
    verdict: "Verdict | None" = None


@runtime_checkable
class Environment(Protocol):
    def reset(self, task: "Task") -> Observation: ...

    def step(self, action: str) -> StepResult: ...

    def close(self) -> None: ...
