"""The policy contract: prompts in, completions (with token ids and log-probs) out.

Backends: a local torch model (`posttrain.policies.local.TorchPolicy`), any OpenAI-compatible
server (`posttrain.policies.openai_compat.OpenAIPolicy`, for vLLM / SGLang; a local model can be
served with `python -m posttrain.policies.serve`), and scripted policies for tests and smoke runs
(`posttrain.policies.scripted`: oracle, negatives, replay). A policy is stateless between calls:
an episode's history travels in each request's `messages`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

from posttrain.values.generation import Completion, GenerationRequest, PolicyVersion


class PolicyError(RuntimeError):
    """The backend failed as a whole (server down, model cannot load): infrastructure."""


@runtime_checkable
class Policy(Protocol):
    """Everything a caller may use of a policy; a backend that cannot answer one of these says so
    with None rather than leaving the member out (callers never probe with getattr)."""

    # read-only members: a plain attribute or a property satisfies them
    @property
    def version(self) -> PolicyVersion:
        """the identity of the weights this policy samples with, recorded in every trajectory. A
        policy carries it; whoever made the weights owns it (`Trainer.version` for trained ones)."""
        ...

    @property
    def max_positions(self) -> int | None:
        """the model's context: prompt and completion positions together. None when the backend
        does not say (a server checks on its own; scripted policies have no context)."""
        ...

    @property
    def accepts_images(self) -> bool:
        """whether the policy reads image content (`posttrain.values.image`); a text-only policy
        is given image domains' textual fallbacks, or refused for domains without one
        (`posttrain.envs.vision.for_policy`)"""
        ...

    def render(self, request: GenerationRequest) -> list[int] | None:
        """The prompt's token ids as this policy's model would see them (chat template applied),
        or None when the policy has no tokenizer. What `max_positions` is measured against."""
        ...

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        """Complete every request (batched by the backend); one Completion per request, in order."""
        ...


@runtime_checkable
class ScriptedPlayer(Protocol):
    """A policy that plays fixed turns instead of generating (oracle, negatives, replay).

    It never sees a task: the engine, which knows the task of every episode group, computes the
    turns each of its `roles` names (a domain's oracle, or one of its negatives) and hands them
    over with `assign` before the group's first request; requests then carry only routing ids
    (the group id and the turn number in `GenerationRequest.meta`)."""

    version: PolicyVersion
    roles: tuple[str, ...]
    """'oracle', or names of negatives ('empty', 'wrong', ...): the scripts `assign` is given"""

    def assign(self, route: str, scripts: Mapping[str, Sequence[str]]) -> None:
        """The turns of each role (one action per turn) for every episode whose requests carry
        group id `route`."""
        ...

    def refuse(self, route: str, reason: str) -> None:
        """The group `route` has no script (e.g. its domain has no such negative): its requests
        get error completions saying `reason`."""
        ...
