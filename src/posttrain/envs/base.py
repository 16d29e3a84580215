"""The environment contract, Gymnasium-style, over model text.

    obs = env.reset(task)                 # what the policy sees first
    while True:
        result = env.step(action_text)    # one policy turn
        if result.terminated or result.truncated:
            break

`terminated` means the task ended on its own terms (an answer was submitted); `truncated` means a
budget ran out first (turns, tokens, time). When a driver's own budget ends the episode (the
model's context is spent), it calls `env.finish(None, truncated=True)`: the episode is graded on
what it did. Either way the end is an `EpisodeEnd` (the verdict and the final workspace). A
tool that fails, an action that cannot be parsed or an unknown tool is *not* an error of the
episode: it comes back as an observation that says so, and the event is counted in `info`.
Only infrastructure failures (the sandbox died) raise, as `posttrain.sandbox.base.SandboxError`.

Action format (documented for users in the README): see `posttrain.envs.actions`.
"""

from __future__ import annotations

from collections.abc import Mapping
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


@dataclass(frozen=True)
class EpisodeEnd:
    """How an episode ended: what the verifier said and what the workspace held at the end."""

    verdict: Verdict
    truncated: bool
    """True when a budget ended it (turns, time, context), False when the task ended on its terms"""
    workspace_archive: bytes | None = None
    """the final workspace as a tar archive (sandboxed tool episodes), stored beside the
    trajectory so the episode can be replayed from its final state; None without a workspace"""


@dataclass
class StepResult:
    observation: Observation
    reward: float | None
    """set when the episode ends (the verdict's score); None before"""
    terminated: bool
    truncated: bool
    info: dict[str, Any] = field(default_factory=dict)
    """per-step facts: parsed tool calls, tool results, parse errors, timings, snapshot id"""
    verdict: Verdict | None = None
    end: EpisodeEnd | None = None
    """set on the step that ends the episode (`verdict` is `end.verdict`)"""


@runtime_checkable
class Environment(Protocol):
    """Everything an episode driver uses of an environment (nothing is probed with getattr)."""

    counters: dict[str, int]
    """events of the episode so far (parse errors, tool errors, truncations, limits hit)"""
    timings: dict[str, float]
    """seconds spent so far in tools ('tool_s') and in grading ('verify_s')"""
    @property
    def sandbox_info(self) -> Mapping[str, Any]:
        """the sandbox the episode ran in (backend, image, isolation layers); empty without one"""
        ...

    def reset(self, task: Task) -> Observation:
        """Start an episode of `task` (opening its sandbox if it has one): the first observation."""
        ...

    def step(self, action: str) -> StepResult:
        """One policy turn. Raises only on infrastructure failures (`SandboxError`, `VerifierError`)."""
        ...

    def finish(self, answer: str | None, truncated: bool) -> EpisodeEnd:
        """Grade now and end the episode: with the submitted `answer`, or with None when a
        budget the driver keeps (the model's context) ran out first."""
        ...

    def close(self) -> None:
        """Release the sandbox; safe to call twice."""
        ...
