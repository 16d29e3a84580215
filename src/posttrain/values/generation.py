"""What flows between an episode and a policy: `SamplingParams`, `Message`, `GenerationRequest`,
`Completion` (with token ids and log-probs) and `PolicyVersion` (the identity of the weights).
Plain values; the `Policy` protocol that consumes them lives in `posttrain.policies.base`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from posttrain.values.image import Content, Image, content_images, content_text


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    """0 means greedy"""
    top_p: float = 1.0
    max_tokens: int = 64
    """new tokens per completion; a completion cut by it has finish_reason 'length'"""
    stop: tuple[str, ...] = ()
    """the completion ends before the first of these strings (which is not included)"""
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"SamplingParams.temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p}")
        if self.max_tokens < 1:
            raise ValueError(f"SamplingParams.max_tokens must be >= 1, got {self.max_tokens}")

    def to_dict(self) -> dict[str, Any]:
        # the fields as they are (all plain values; `asdict`'s deep copy cost more than the
        # rest of a short episode's bookkeeping), with `stop` as a JSON list
        d = dict(self.__dict__)
        d["stop"] = list(self.stop)
        return d


@dataclass(frozen=True)
class Message:
    role: Literal["system", "user", "assistant", "tool"]
    content: Content
    """a str, or a tuple of text and image parts (`posttrain.values.image`); `text` reads either"""

    @property
    def text(self) -> str:
        """The text of the content (images left out)."""
        return content_text(self.content)

    @property
    def images(self) -> tuple[Image, ...]:
        return content_images(self.content)


@dataclass(frozen=True)
class GenerationRequest:
    """One prompt to complete. `messages` is the episode so far; the policy renders it."""

    messages: tuple[Message, ...]
    sampling: SamplingParams = SamplingParams()
    request_id: str = ""
    meta: Mapping[str, Any] = field(default_factory=dict)
    """opaque routing data (episode id, domain); backends may use it for sticky routing"""
    prefix_ids: tuple[int, ...] | None = None
    """token-in/token-out: the token ids of the episode so far (the previous turn's prompt ids
    followed by its completion ids), which stand for `messages[:prefix_messages]`. A backend
    that tokenizes appends only the ids of the messages after them and never re-tokenizes the
    history (`posttrain.policies.render.continue_ids`); others render `messages` as usual"""
    prefix_messages: int = 0
    """how many leading messages `prefix_ids` covers"""
    message_ids: tuple[tuple[int, ...] | None, ...] | None = None
    """token-in/token-out for a history that is no longer a prefix of the last prompt (a context
    policy replaced earlier observations by markers, `posttrain.envs.budget.ContextPolicy`): one
    entry per message, its recorded ids (an action's as sampled) or None for a message the backend
    renders from its text (a marker, an observation). Set instead of `prefix_ids`
    (`posttrain.policies.render.splice_ids`); a backend that does not tokenize renders `messages`"""

    def __post_init__(self) -> None:
        if self.prefix_ids is not None and not 0 < self.prefix_messages < len(self.messages):
            raise ValueError(f"GenerationRequest.prefix_messages must be in [1, {len(self.messages) - 1}] "
                             f"when prefix_ids is set, got {self.prefix_messages}")
        if self.message_ids is not None:
            if self.prefix_ids is not None:
                raise ValueError("GenerationRequest: set prefix_ids or message_ids, not both")
            if len(self.message_ids) != len(self.messages):
                raise ValueError(f"GenerationRequest.message_ids has {len(self.message_ids)} entries "
                                 f"for {len(self.messages)} messages")


@dataclass
class Completion:
    text: str
    finish_reason: Literal["stop", "length", "error"]
    prompt_token_ids: list[int] | None = None
    token_ids: list[int] | None = None
    """the generated tokens (after stop-string trimming), when the backend exposes them"""
    logprobs: list[float] | None = None
    """log-prob of each generated token under the sampling policy, aligned with token_ids"""
    gen_s: float = 0.0
    """generation seconds this completion cost. A backend that decodes a batch at once splits the
    batch's time between its completions (in proportion to the tokens each one decoded), so that
    summed over episodes it is the generator's time, not the batch time counted once per row"""
    error: str | None = None
    """set (with finish_reason 'error') when the backend failed for this request"""
    context_exceeded: bool = False
    """set (with finish_reason 'error') when the request's prompt does not fit the model's
    context, so nothing could be generated: in a multi-turn episode this is the end of its
    context budget (the episode is truncated), not an infrastructure failure"""
    prefill_tokens: int = 0
    """prompt tokens the backend computed for this completion (0 when it does not say)"""
    reused_tokens: int = 0
    """prompt tokens whose keys/values it reused from an earlier request (a prefix cache: an
    episode's earlier turns); prefill_tokens + reused_tokens = the prompt, when reported"""


@dataclass(frozen=True)
class PolicyVersion:
    """Identity of the weights that produced a completion; versions form a lineage."""

    name: str
    """e.g. 'base', 'run-1/step-40'"""
    parent: str | None = None
    weights_hash: str = ""
    tokenizer_hash: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
