"""Keys and values of sequences already computed, found again by their longest token prefix.

A multi-turn episode's prompt at turn k+1 is its prompt at turn k, the completion and the new
observation. `PrefixCache` keeps, per finished generation, the keys/values of every token the
model computed (prompt + completion), so the next turn prefills only what is new: the longest
cached prefix of a prompt is reused, whichever entry holds it (a prefix of an entry is as good
as the entry: attention is causal, so a prefix's keys/values do not depend on what follows).

* **lookup** -- entries are indexed by their prefixes at multiples of `block` tokens (tuples
  hashed by Python). Having a block prefix implies having every shorter one, so the longest
  shared block is found by binary search, then extended token by token (less than one block)
  within the entries that share it.
* **eviction** -- least recently used first (a hit refreshes an entry), under a budget of bytes
  of key/value tensors, so concurrent episodes share memory sanely: an idle episode's context
  goes first. An entry whose tokens are a prefix of a newer one is dropped when the newer one
  arrives (the newer one serves every lookup the older one could).
* **weights** -- keys/values belong to the weights that computed them: the owner calls
  `check_weights(fingerprint)` before each use, which empties the cache when they changed.

Entries are per sequence, not a shared radix tree: a GRPO group's eight completions each hold
their own copy of the shared prompt (counted against the budget as such).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from posttrain.policies.ragged import LayerKV


@dataclass
class _Entry:
    tokens: tuple[int, ...]
    kv: list[LayerKV]
    nbytes: int


class PrefixCache:
    """Least-recently-used store of (tokens -> keys/values) under a byte budget."""

    def __init__(self, max_bytes: int, block: int = 16) -> None:
        if max_bytes < 0:
            raise ValueError(f"PrefixCache max_bytes must be >= 0, got {max_bytes}")
        if block < 1:
            raise ValueError(f"PrefixCache block must be >= 1, got {block}")
        self.max_bytes, self.block = max_bytes, block
        self._entries: OrderedDict[int, _Entry] = OrderedDict()  # oldest use first
        self._index: dict[tuple[int, ...], set[int]] = {}  # block prefix -> entry ids
        self._next_id = 0
        self.nbytes = 0
        self._weights: Hashable = None
        self.hits = self.lookups = self.evictions = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def tokens(self) -> int:
        return sum(len(e.tokens) for e in self._entries.values())

    def check_weights(self, fingerprint: Hashable) -> None:
        """Empty the cache when the weights that computed it are not these."""
        if fingerprint != self._weights:
            self.clear()
            self._weights = fingerprint

    def clear(self) -> None:
        self._entries.clear()
        self._index.clear()
        self.nbytes = 0

    def _candidates(self, tokens: Sequence[int]) -> tuple[int, set[int]]:
        """(longest shared block prefix length, the entries that share it)."""
        lo, hi = 0, len(tokens) // self.block  # invariant: lo blocks are shared (0 trivially)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if tuple(tokens[:mid * self.block]) in self._index:
                lo = mid
            else:
                hi = mid - 1
        if lo == 0:
            return 0, set(self._entries)  # short prompts: every entry may share a few tokens
        return lo * self.block, self._index[tuple(tokens[:lo * self.block])]

    def _best(self, tokens: Sequence[int]) -> tuple[int, int | None]:
        start, ids = self._candidates(tokens)
        best, best_id = 0, None
        for i in sorted(ids, reverse=True)[:64]:  # newest first; more would cost more than it saves
            entry = self._entries[i].tokens
            n, end = start, min(len(entry), len(tokens))
            while n < end and entry[n] == tokens[n]:
                n += 1
            if n > best:
                best, best_id = n, i
        return best, best_id

    def lookup(self, tokens: Sequence[int], limit: int | None = None) -> tuple[int, list[LayerKV] | None]:
        """(n, keys/values of tokens[:n]) for the longest cached prefix, n <= limit; (0, None)
        when nothing is shared."""
        self.lookups += 1
        n, i = self._best(tokens)
        if limit is not None:
            n = min(n, limit)
        if i is None or n == 0:
            return 0, None
        self.hits += 1
        self._entries.move_to_end(i)
        return n, [(k[:, :n], v[:, :n]) for k, v in self._entries[i].kv]

    def insert(self, tokens: Sequence[int], kv: list[LayerKV]) -> None:
        """Store the keys/values of `tokens` (one [heads, len(tokens), dim] pair per layer)."""
        tokens = tuple(tokens)
        if not tokens:
            return
        for layer, (k, v) in enumerate(kv):
            if k.shape[-2] != len(tokens) or v.shape[-2] != len(tokens):
                raise ValueError(f"PrefixCache.insert: layer {layer} holds {k.shape[-2]} positions "
                                 f"for {len(tokens)} tokens")
        nbytes = sum(k.nbytes + v.nbytes for k, v in kv)
        if nbytes > self.max_bytes:
            return
        _, ids = self._candidates(tokens)
        for i in list(ids):
            old = self._entries[i].tokens
            if len(old) <= len(tokens) and tokens[:len(old)] == old:
                self._remove(i)  # this one covers it
            elif len(old) > len(tokens) and old[:len(tokens)] == tokens:
                self._entries.move_to_end(i)  # already covered by a longer one
                return
        i, self._next_id = self._next_id, self._next_id + 1
        self._entries[i] = _Entry(tokens, [(k.detach(), v.detach()) for k, v in kv], nbytes)
        for j in range(1, len(tokens) // self.block + 1):
            self._index.setdefault(tokens[:j * self.block], set()).add(i)
        self.nbytes += nbytes
        while self.nbytes > self.max_bytes:
            self._remove(next(iter(self._entries)))
            self.evictions += 1

    def _remove(self, i: int) -> None:
        entry = self._entries.pop(i)
        self.nbytes -= entry.nbytes
        for j in range(1, len(entry.tokens) // self.block + 1):
            key = entry.tokens[:j * self.block]
            ids = self._index[key]
            ids.discard(i)
            if not ids:
                del self._index[key]

    def stats(self) -> dict[str, Any]:
        return {"entries": len(self), "tokens": self.tokens, "bytes": self.nbytes,
                "lookups": self.lookups, "hits": self.hits, "evictions": self.evictions}


def weights_fingerprint(model: torch.nn.Module) -> tuple:
    """Changes whenever a parameter is modified in place (an optimizer step, `load_state_dict`)
    or replaced: each tensor's storage address and autograd version counter. Costs one pass
    over the parameter list, not over the weights."""
    return tuple((p.data_ptr(), p._version) for p in model.parameters())
