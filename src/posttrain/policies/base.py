"""The policy contract: prompts in, completions (with token ids and log-probs) out.

Backends: a local torch model (`posttrain.policies.local.TorchPolicy`), any OpenAI-compatible
server (`posttrain.policies.openai_compat.OpenAIPolicy`, for vLLM / SGLang; a local model can be
served with `python -m posttrain.policies.serve`), and scripted policies for tests and smoke runs
(`posttrain.policies.scripted`: oracle, negatives, replay). A policy is stateless between calls:
an episode's history travels in each request's `messages`.
"""

from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable

from posttrain.values.generation import Completion, GenerationRequest, PolicyVersion


class PolicyError(RuntimeError):
    """The backend failed as a whole (server down, model cannot load): infrastructure."""


@runtime_checkable
class Policy(Protocol):
    version: PolicyVersion

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        """Complete every request (batched by the backend); one Completion per request, in order."""
        ...
