"""A batch of rows over one KV cache, each row growing by its own number of tokens per forward.

Standard decoding appends exactly one token to every row per step, so left padding keeps every
row's newest token in the last column. Speculative decoding does not: a row feeds its pending
token plus however many draft tokens it has, then keeps only those the target accepted; an
episode's next turn starts from however much of its prompt a prefix cache holds. `RaggedBatch`
handles both with the attention mask alone:

* each forward appends one block of `W` columns (the longest chunk); a shorter chunk is
  right-aligned in it and its leading slots are masked holes;
* `retract(row, n)` masks a row's last `n` real columns (rejected drafts): their keys and values
  stay in the tensors but nothing ever attends to them again;
* position ids count a row's real tokens only, so every row computes what it would alone (up to
  float rounding), whatever holes the cache holds;
* `compact()` repacks the rows right-aligned when holes have grown, so attention does not pay for
  them forever.

The cache must be a `DynamicCache` of plain `DynamicLayer`s (full attention, keys and values as
`[batch, heads, seq, head_dim]` tensors): `supports_ragged` checks a model once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from posttrain.policies.decode import cache_kwarg, keep_last, output_cache

LayerKV = tuple[torch.Tensor, torch.Tensor]
"""one layer's (keys, values) for one row: [heads, tokens, head_dim] each"""


def _layers(cache: Any) -> list[Any] | None:
    """The cache's layers when every one of them holds plain full-attention key/value tensors."""
    from transformers.cache_utils import DynamicCache, DynamicLayer

    if not isinstance(cache, DynamicCache):
        return None
    layers = list(getattr(cache, "layers", []))
    if not layers or any(type(layer) is not DynamicLayer for layer in layers):
        return None
    return layers


@torch.inference_mode()
def supports_ragged(model: torch.nn.Module) -> str | None:
    """None when `model`'s KV cache can be edited row by row, else why not (for an error)."""
    device = next(model.parameters()).device
    ids = torch.ones((1, 2), dtype=torch.long, device=device)
    try:
        out = model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=True,
                    **keep_last(model, 1))
    except Exception as e:  # a model that cannot even run a forward fails later, loudly
        return f"a test forward failed: {type(e).__name__}: {e}"
    cache = output_cache(out)
    if _layers(cache) is None:
        return (f"its KV cache is a {type(cache).__name__} with layers "
                f"{sorted({type(x).__name__ for x in getattr(cache, 'layers', [])})}, "
                "not a DynamicCache of full-attention DynamicLayers")
    return None


class RaggedBatch:
    """Rows of token sequences whose keys and values live in one batched cache."""

    def __init__(self, model: torch.nn.Module, pad_id: int,
                 prefixes: Sequence[tuple[list[int], list[LayerKV] | None]]) -> None:
        """Start from each row's already computed prefix: (its tokens, its keys/values per
        layer, or None when nothing is computed yet -- then the tokens list must be empty)."""
        self.model, self.pad_id = model, pad_id
        self.device = next(model.parameters()).device
        self.kw = cache_kwarg(model)
        self.fed: list[list[int]] = [list(tokens) for tokens, _ in prefixes]
        """per row, the tokens whose keys/values are in the cache, in order"""
        width = max((len(t) for t in self.fed), default=0)
        mask = torch.zeros((len(prefixes), width), dtype=torch.long)
        self.cache: Any = None
        known = [kv for _, kv in prefixes if kv is not None]
        for r, (tokens, kv) in enumerate(prefixes):
            if len(tokens) and kv is None:
                raise ValueError(f"RaggedBatch row {r}: {len(tokens)} prefix tokens but no keys/values")
            mask[r, width - len(tokens):] = 1 if tokens else 0
        if width and known:
            from transformers.cache_utils import DynamicCache

            data = []
            for layer in range(len(known[0])):
                k0, v0 = known[0][layer]
                keys = k0.new_zeros((len(prefixes), k0.shape[0], width, k0.shape[-1]))
                values = v0.new_zeros((len(prefixes), v0.shape[0], width, v0.shape[-1]))
                for r, (tokens, kv) in enumerate(prefixes):
                    if tokens:
                        keys[r, :, width - len(tokens):] = kv[layer][0]  # type: ignore[index]
                        values[r, :, width - len(tokens):] = kv[layer][1]  # type: ignore[index]
                data.append((keys.to(self.device), values.to(self.device)))
            self.cache = DynamicCache(ddp_cache_data=data)
        self.mask = mask.to(self.device)

    def __len__(self) -> int:
        return len(self.fed)

    @property
    def width(self) -> int:
        return self.mask.shape[1]

    def forward(self, chunks: Sequence[Sequence[int]], extra: dict[str, Any] | None = None
                ) -> tuple[torch.Tensor, list[int]]:
        """Append each row's chunk; returns the logits of the new block [rows, W, vocab] and each
        chunk's length (row r's logits are its last `lengths[r]` positions). `extra`: more
        forward() inputs for this block (a vision model's image tensors for the images whose
        positions it holds, in row order)."""
        if len(chunks) != len(self.fed):
            raise ValueError(f"RaggedBatch.forward: {len(chunks)} chunks for {len(self.fed)} rows")
        lengths = [len(c) for c in chunks]
        w = max(lengths)
        if w == 0:
            raise ValueError("RaggedBatch.forward: every chunk is empty")
        ids, block, pos = [], [], []
        for r, c in enumerate(chunks):
            hole, start = w - len(c), len(self.fed[r])
            ids.append([self.pad_id] * hole + list(c))
            block.append([0] * hole + [1] * len(c))
            pos.append([0] * hole + list(range(start, start + len(c))))
            self.fed[r].extend(c)
        t = lambda x: torch.tensor(x, dtype=torch.long, device=self.device)  # noqa: E731
        self.mask = torch.cat([self.mask, t(block)], dim=1)
        kwargs = {self.kw: self.cache} if self.cache is not None else {}
        out = self.model(input_ids=t(ids), attention_mask=self.mask, position_ids=t(pos),
                         use_cache=True, **kwargs, **keep_last(self.model, w),
                         **{k: v.to(self.device) for k, v in (extra or {}).items()})
        self.cache = output_cache(out)
        return out.logits[:, -w:, :], lengths

    def retract(self, row: int, n: int) -> None:
        """Forget the row's last `n` fed tokens (rejected drafts): their columns become holes."""
        if n <= 0:
            return
        if n > len(self.fed[row]):
            raise ValueError(f"RaggedBatch.retract: row {row} has {len(self.fed[row])} tokens, not {n}")
        real = self.mask[row].nonzero().flatten()[-n:]
        self.mask[row, real] = 0
        del self.fed[row][-n:]

    def select(self, index: Sequence[int]) -> None:
        """Keep these rows, in this order (an index may repeat: the row is copied)."""
        idx = torch.tensor(list(index), dtype=torch.long, device=self.device)
        if self.cache is not None:
            self.cache.batch_select_indices(idx)
        self.mask = self.mask[idx]
        self.fed = [list(self.fed[i]) for i in index]

    def row_kv(self, row: int) -> list[LayerKV]:
        """The row's keys and values per layer, holes removed: [heads, len(fed), head_dim]."""
        layers = _layers(self.cache)
        if layers is None:
            raise ValueError(f"RaggedBatch: cannot read rows of a {type(self.cache).__name__}")
        real = self.mask[row].nonzero().flatten()
        return [(layer.keys[row][:, real].contiguous(), layer.values[row][:, real].contiguous())
                for layer in layers]

    def compact(self, slack: float = 0.25) -> None:
        """Repack every row right-aligned when holes take more than `slack` of the width."""
        longest = max((len(f) for f in self.fed), default=0)
        if self.width <= longest * (1 + slack) + 4:
            return
        layers = _layers(self.cache)
        if layers is None:
            return
        rows = len(self.fed)
        index = torch.zeros((rows, longest), dtype=torch.long, device=self.device)
        mask = torch.zeros((rows, longest), dtype=torch.long, device=self.device)
        for r in range(rows):
            real = self.mask[r].nonzero().flatten()
            if len(real):
                index[r, longest - len(real):] = real
                mask[r, longest - len(real):] = 1
        for layer in layers:
            heads, dim = layer.keys.shape[1], layer.keys.shape[-1]
            gather = index[:, None, :, None].expand(rows, heads, longest, dim)
            layer.keys = layer.keys.gather(2, gather)
            layer.values = layer.values.gather(2, gather)
        self.mask = mask
