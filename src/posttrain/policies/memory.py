"""How many rows one generation batch may hold: a token budget from the model's size.

A batch's transient memory grows with rows x padded length: every row keeps keys and values of
every layer for its whole length, the prefill computes one layer's activations and attention
scores over the longest prompt for every row, and sampling holds a few float32 copies of each
row's logits. A batch of long prompts that fits the row limit can still ask for tens of GB, so
`plan_batches` cuts a request list into consecutive batches whose estimate stays under a cap.
The estimate is deliberately simple (dense attention, no allocator slack): it bounds batches
of very different lengths, it does not predict a peak to the byte.

Training has the same problem with a bigger bill (every layer's activations are kept for the
backward pass): `MemoryModel.train_tokens` turns a cap into the padded tokens (rows x longest row)
one training micro-batch may hold, the trainer's default `micro_batch_tokens`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["MemoryModel", "default_cap_bytes", "plan_batches"]


def _attr(config: Any, *names: str, default: int = 0) -> int:
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return default


@dataclass(frozen=True)
class MemoryModel:
    """Bytes a generation batch needs, per row, from a model's shape."""

    kv_per_token: int
    """keys + values of every layer, one position"""
    act_per_token: int
    """one layer's activations (hidden states, MLP, q/k/v), one prompt position"""
    attn_per_pair: int
    """one layer's attention scores, one (query, key) pair of the prefill"""
    logits_per_row: int
    """the last position's logits and the sampler's float32 copies of them"""
    layers: int = 1
    """transformer layers: training keeps every layer's activations for the backward pass"""
    logits_per_position: int = 0
    """training: one position's logits, their float32 log-softmax and its gradient"""

    @classmethod
    def of(cls, model: torch.nn.Module) -> MemoryModel:
        config = model.config
        text_config = getattr(config, "get_text_config", None)
        if callable(text_config):  # a vision-language model: its language model's shape
            config = text_config()
        layers = _attr(config, "num_hidden_layers", "n_layer", "num_layers", default=1)
        hidden = _attr(config, "hidden_size", "n_embd", "d_model", default=1)
        heads = _attr(config, "num_attention_heads", "n_head", default=1)
        kv_heads = _attr(config, "num_key_value_heads", default=heads)
        inner = _attr(config, "intermediate_size", "n_inner", "ffn_dim", default=4 * hidden)
        vocab = _attr(config, "vocab_size", default=1)
        elem = next(model.parameters()).element_size()
        kv_dim = hidden * kv_heads // max(1, heads)
        return cls(kv_per_token=2 * layers * kv_dim * elem,
                   act_per_token=(4 * hidden + 2 * inner) * elem,
                   attn_per_pair=heads * elem,
                   logits_per_row=4 * vocab * 4, layers=layers,
                   logits_per_position=vocab * (elem + 3 * 4))

    def batch_bytes(self, rows: int, prompt_len: int, total_len: int) -> int:
        """`rows` rows padded to `prompt_len` prompt positions, growing to `total_len`."""
        per_row = (self.kv_per_token * total_len + self.act_per_token * prompt_len
                   + self.attn_per_pair * prompt_len * prompt_len + self.logits_per_row)
        return rows * per_row


    def train_bytes_per_token(self, length: int) -> int:
        """Training (forward kept for backward, then backward) bytes per padded token of a
        micro-batch whose rows are `length` tokens long: every layer's saved activations (about
        three times one layer's forward set: what the forward keeps, plus the backward's own),
        its attention probabilities and their gradient (a row of `length` per token), and the
        logits of the scored positions (counted at every position: an upper bound)."""
        return (self.layers * (TRAIN_ACT_FACTOR * self.act_per_token + 2 * self.attn_per_pair * length)
                + self.logits_per_position)

    def train_tokens(self, cap_bytes: int, length: int) -> int:
        """Padded tokens (rows x longest row) a training micro-batch of rows at most `length` long
        may hold under `cap_bytes`: at least `length` (one row always runs)."""
        return max(length, cap_bytes // max(1, self.train_bytes_per_token(length)))


TRAIN_ACT_FACTOR = 3
"""training activations per layer and token, in units of one layer's forward activations"""


def default_cap_bytes(device: torch.device) -> int:
    """Half the device's free memory (a GPU), or a quarter of the machine's memory (the CPU)."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free * 0.5)
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        total = 8 * 2**30
    return int(total * 0.25)


def plan_batches(lengths: Sequence[tuple[int, int]], memory: MemoryModel, cap_bytes: int,
                 max_rows: int) -> list[tuple[int, int]]:
    """Consecutive (lo, hi) ranges over rows of (prompt length, prompt + max new tokens), each
    at most `max_rows` rows and, unless a single row alone exceeds it, `cap_bytes` by the
    estimate. Order is kept: the caller's results come back in its order."""
    out: list[tuple[int, int]] = []
    lo = 0
    n = len(lengths)
    while lo < n:
        hi, prompt, total = lo + 1, lengths[lo][0], lengths[lo][1]
        while hi < n and hi - lo < max_rows:
            p, t = max(prompt, lengths[hi][0]), max(total, lengths[hi][1])
            if memory.batch_bytes(hi - lo + 1, p, t) > cap_bytes:
                break
            hi, prompt, total = hi + 1, p, t
        out.append((lo, hi))
        lo = hi
    return out
