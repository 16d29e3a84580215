"""Turning an episode's `messages` into the token ids a causal LM is conditioned on.

Two renderings, chosen by the tokenizer:

* **chat template** -- when the tokenizer has one (`tokenizer.chat_template`), the messages go
  through `apply_chat_template(..., add_generation_prompt=True)`, exactly as the model's authors
  intended; the template adds its own special tokens, so none are added again.
* **plain template** -- a base model without a chat template is a text-completion model. The
  message contents are joined with "\\n", in order, roles dropped; a single user message therefore
  renders to exactly its content (the shipped tiny model sees exactly `task.prompt`). The
  tokenizer then adds its usual special tokens (the tiny model's tokenizer prepends `<bos>`;
  GPT-2's adds nothing).

**Token-in/token-out** (`continue_ids`): in a multi-turn episode the next prompt is the previous
prompt's ids, the completion's ids as sampled, and the ids of the new messages only -- the
history is never re-tokenized (re-tokenizing decoded text can give other ids than the ones
sampled, and a trainer would then train on tokens the model never produced). Under the plain
template the new messages are "\n" + their contents joined with "\n"; a completion follows its
prompt directly. When a context policy has replaced earlier observations by markers, the history
is no longer a prefix of the last prompt: `splice_ids` rebuilds it from each message's recorded
ids (the actions' as sampled) and renders only the messages without ids (markers, observations:
"\n" + the text, tokenized on its own exactly as `continue_ids` did when they were new). With a
chat template the history is re-rendered (the template's turn delimiters would have to be spliced
around sampled ids; not done here).

The plain template is *not* a chat format: it does not mark who said what. A multi-turn episode
on a base model reads as one transcript (prompt, answer, next observation, ...), which is what
a completion model trained on such transcripts expects, and nothing more.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from posttrain.values.generation import Message

PLAIN_SEPARATOR = "\n"


def _text_only(messages: Sequence[Message]) -> None:
    """A text rendering cannot show images: refuse rather than drop them silently."""
    n = sum(len(m.images) for m in messages)
    if n:
        raise ValueError(f"this policy renders text only, and the request carries {n} image(s); "
                         "run image domains with a vision policy, or text-only (EnvConfig.text_only) "
                         "where the domain declares a textual fallback")


def plain_text(messages: Sequence[Message]) -> str:
    """The plain template: contents joined with "\\n" (one user message -> its content)."""
    if not messages:
        raise ValueError("cannot render an empty list of messages")
    _text_only(messages)
    return PLAIN_SEPARATOR.join(m.text for m in messages)


def has_chat_template(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def render_text(tokenizer: Any, messages: Sequence[Message]) -> str:
    """The prompt as text (chat template if the tokenizer has one, else the plain template)."""
    if not messages:
        raise ValueError("cannot render an empty list of messages")
    if has_chat_template(tokenizer):
        _text_only(messages)
        return tokenizer.apply_chat_template(
            [{"role": m.role, "content": m.text} for m in messages],
            add_generation_prompt=True, tokenize=False)
    return plain_text(messages)


def render_ids(tokenizer: Any, messages: Sequence[Message]) -> list[int]:
    """The prompt's token ids, with the special tokens the rendering calls for."""
    text = render_text(tokenizer, messages)
    # A chat template writes its special tokens (BOS included) into the text itself.
    add_special = not has_chat_template(tokenizer)
    return list(tokenizer(text, add_special_tokens=add_special)["input_ids"])


def continue_ids(tokenizer: Any, prefix_ids: Sequence[int], new_messages: Sequence[Message]) -> list[int] | None:
    """Token-in/token-out: `prefix_ids` + the ids of `new_messages` (plain template), or None
    when the tokenizer has a chat template (the caller renders the whole history then)."""
    if not new_messages:
        raise ValueError("continue_ids needs at least one new message")
    if has_chat_template(tokenizer):
        return None
    tail = PLAIN_SEPARATOR + plain_text(new_messages)
    return list(prefix_ids) + list(tokenizer(tail, add_special_tokens=False)["input_ids"])


def splice_ids(tokenizer: Any, message_ids: Sequence[Sequence[int] | None],
               messages: Sequence[Message]) -> list[int] | None:
    """The prompt rebuilt message by message: a message's recorded ids where given, else its
    rendering under the plain template (the first message with the tokenizer's special tokens,
    any other as "\n" + its text). None when the tokenizer has a chat template (the caller
    renders the whole history then)."""
    if len(message_ids) != len(messages):
        raise ValueError(f"splice_ids: {len(message_ids)} id entries for {len(messages)} messages")
    if has_chat_template(tokenizer):
        return None
    ids: list[int] = []
    for i, (known, message) in enumerate(zip(message_ids, messages)):
        if known is not None:
            ids += known
        elif i == 0:
            ids += render_ids(tokenizer, [message])
        else:
            ids += tokenizer(PLAIN_SEPARATOR + plain_text([message]), add_special_tokens=False)["input_ids"]
    return ids
