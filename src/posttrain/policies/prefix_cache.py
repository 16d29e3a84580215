"""Keys and values of sequences already computed, shared by token prefix in a radix tree.

A multi-turn episode's prompt at turn k+1 is its prompt at turn k, the completion and the new
observation; two episodes of one task share its instruction; a GRPO group's rows share their
prompt. `PrefixCache` stores the keys/values of every token the model computed (prompt +
completion) in a radix tree keyed by token ids (SGLang's RadixAttention, on CPU tensors): each
node holds one edge of tokens and their keys/values, a sequence is the path from the root, and a
prefix two sequences share is one path, stored once. A request then prefills only what follows
its longest cached prefix, whichever earlier requests computed it (attention is causal: a
prefix's keys/values do not depend on what follows).

* **lookup** -- walks the tree along the prompt's tokens (a partial edge counts too) and returns
  the matched keys/values, concatenated. `acquire` also pins the matched path (see eviction)
  and returns a handle for `release`.
* **insert** -- walks the same way and adds only the part not cached yet (a node is split where
  the new sequence leaves its edge), so memory grows by the new tokens only.
* **eviction** -- least recently used leaves first (a lookup or insert refreshes its whole
  path), under a budget of tokens and/or bytes of key/value tensors, so concurrent episodes share
  memory sanely: an idle episode's context goes first, a shared instruction goes last (it is
  never a leaf while anything below it is kept). A node on a path pinned by a running request is
  never evicted: the budget may be exceeded while every candidate is pinned, and is restored as
  soon as one is released.
* **weights** -- keys/values belong to the weights that computed them: the owner calls
  `check_weights(fingerprint)` before each use, which empties the cache when they changed.
  Handles from before a `clear` release harmlessly (their nodes are no longer in the tree).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Hashable, Sequence
from typing import Any

import torch

from posttrain.policies.ragged import LayerKV


class _Node:
    __slots__ = ("tokens", "kv", "nbytes", "parent", "children", "last_used", "locks", "id")

    def __init__(self, tokens: tuple[int, ...], kv: list[LayerKV], parent: _Node | None, node_id: int) -> None:
        self.tokens = tokens
        self.kv = kv
        self.nbytes = sum(k.nbytes + v.nbytes for k, v in kv)
        self.parent = parent
        self.children: dict[int, _Node] = {}  # first token of the child's edge -> child
        self.last_used = 0
        self.locks = 0
        self.id = node_id


def _slice(kv: list[LayerKV], lo: int, hi: int | None = None) -> list[LayerKV]:
    """Own copies of positions lo:hi, so a node never keeps a larger tensor alive."""
    return [(k[:, lo:hi].clone(), v[:, lo:hi].clone()) for k, v in kv]


class PrefixCache:
    """A radix tree of (tokens -> keys/values), least recently used leaves evicted first."""

    def __init__(self, max_bytes: int | None = None, *, max_tokens: int | None = None) -> None:
        if max_bytes is None and max_tokens is None:
            raise ValueError("PrefixCache needs a budget: max_bytes or max_tokens")
        if max_bytes is not None and max_bytes < 0:
            raise ValueError(f"PrefixCache max_bytes must be >= 0, got {max_bytes}")
        if max_tokens is not None and max_tokens < 0:
            raise ValueError(f"PrefixCache max_tokens must be >= 0, got {max_tokens}")
        self.max_bytes, self.max_tokens = max_bytes, max_tokens
        self._ids = itertools.count(1)
        self._clock = itertools.count(1)
        self._root = _Node((), [], None, 0)
        self._nodes = 0
        self.nbytes = 0
        self.tokens = 0
        """tokens stored (each shared prefix once)"""
        self._weights: Hashable = None
        self.hits = self.lookups = self.evictions = 0
        self.reused_tokens = 0
        """tokens that lookups returned, over the cache's lifetime"""

    def __len__(self) -> int:
        """nodes in the tree (edges of tokens)"""
        return self._nodes

    def check_weights(self, fingerprint: Hashable) -> None:
        """Empty the cache when the weights that computed it are not these."""
        if fingerprint != self._weights:
            self.clear()
            self._weights = fingerprint

    def clear(self) -> None:
        self._root = _Node((), [], None, 0)
        self._nodes = self.nbytes = self.tokens = 0

    # -- walking --------------------------------------------------------------------------
    def _match(self, tokens: Sequence[int]) -> tuple[list[tuple[_Node, int]], int]:
        """The path of (node, tokens of its edge matched) the sequence follows, and its length."""
        path: list[tuple[_Node, int]] = []
        node, n = self._root, 0
        while n < len(tokens):
            child = node.children.get(tokens[n])
            if child is None:
                break
            edge, m = child.tokens, 1
            end = min(len(edge), len(tokens) - n)
            while m < end and edge[m] == tokens[n + m]:
                m += 1
            path.append((child, m))
            n += m
            if m < len(edge):
                break
            node = child
        return path, n

    def _touch(self, path: list[tuple[_Node, int]]) -> None:
        now = next(self._clock)
        for node, _ in path:
            node.last_used = now

    def lookup(self, tokens: Sequence[int], limit: int | None = None) -> tuple[int, list[LayerKV] | None]:
        """(n, keys/values of tokens[:n]) for the longest cached prefix, n <= limit; (0, None)
        when nothing is shared."""
        n, kv, _ = self._lookup(tokens, limit, lock=False)
        return n, kv

    def acquire(self, tokens: Sequence[int], limit: int | None = None) -> tuple[int, list[LayerKV] | None, Any]:
        """`lookup`, and the matched path pinned (never evicted) until `release(handle)`: a
        running request's prefix (None when nothing matched)."""
        return self._lookup(tokens, limit, lock=True)

    def _lookup(self, tokens: Sequence[int], limit: int | None, lock: bool) -> tuple[int, list[LayerKV] | None, Any]:
        self.lookups += 1
        path, n = self._match(tokens)
        if limit is not None:
            n = min(n, max(0, limit))
        kept: list[tuple[_Node, int]] = []
        left = n
        for node, m in path:
            if left <= 0:
                break
            kept.append((node, min(m, left)))
            left -= m
        if not kept:
            return 0, None, None
        self.hits += 1
        self.reused_tokens += n
        self._touch(kept)
        layers = len(kept[0][0].kv)
        if len(kept) == 1:
            node, m = kept[0]
            kv = [(k[:, :m], v[:, :m]) for k, v in node.kv]
        else:
            kv = [(torch.cat([node.kv[i][0][:, :m] for node, m in kept], dim=1),
                   torch.cat([node.kv[i][1][:, :m] for node, m in kept], dim=1)) for i in range(layers)]
        if not lock:
            return n, kv, None
        handle = kept[-1][0]
        self._pin(handle, +1)
        return n, kv, handle

    def pin(self, handle: Any) -> None:
        """Pin a handle's path once more (one more request uses it); `release` each pin."""
        if handle is not None:
            self._pin(handle, +1)

    def release(self, handle: Any) -> None:
        """Unpin the path an `acquire` or `insert(lock=True)` pinned; then evict what
        the budget no longer allows."""
        if handle is None:
            return
        self._pin(handle, -1)
        self._evict()

    @staticmethod
    def _pin(node: _Node | None, delta: int) -> None:
        while node is not None and node.parent is not None:
            node.locks += delta
            node = node.parent

    # -- adding ---------------------------------------------------------------------------
    def insert(self, tokens: Sequence[int], kv: list[LayerKV], lock: bool = False) -> Any:
        """Store the keys/values of `tokens` (one [heads, len(tokens), dim] pair per layer);
        only the part not cached yet is copied in. With `lock=True` the whole path is pinned
        and its handle returned (for `release`)."""
        tokens = tuple(tokens)
        for layer, (k, v) in enumerate(kv):
            if k.shape[-2] != len(tokens) or v.shape[-2] != len(tokens):
                raise ValueError(f"PrefixCache.insert: layer {layer} holds {k.shape[-2]} positions "
                                 f"for {len(tokens)} tokens")
        if not tokens:
            return None
        path, n = self._match(tokens)
        node = self._root
        if path:
            last, m = path[-1]
            if m < len(last.tokens) and n < len(tokens):  # the sequence leaves this edge inside it
                last = self._split(last, m)
                path[-1] = (last, m)
            node = last
        if n < len(tokens):
            leaf = _Node(tokens[n:], _slice(kv, n), node, next(self._ids))
            node.children[tokens[n]] = leaf
            self._nodes += 1
            self.nbytes += leaf.nbytes
            self.tokens += len(leaf.tokens)
            path.append((leaf, len(leaf.tokens)))
            node = leaf
        self._touch(path)
        if lock:
            self._pin(node, +1)
        self._evict()
        return node if lock else None

    def _split(self, node: _Node, m: int) -> _Node:
        """Cut `node`'s edge after m tokens: a new parent holds the first m, `node` the rest."""
        assert node.parent is not None
        top = _Node(node.tokens[:m], _slice(node.kv, 0, m), node.parent, next(self._ids))
        top.last_used, top.locks = node.last_used, node.locks
        node.parent.children[node.tokens[0]] = top
        node.tokens, node.kv = node.tokens[m:], _slice(node.kv, m)
        old, node.nbytes = node.nbytes, sum(k.nbytes + v.nbytes for k, v in node.kv)
        self.nbytes += top.nbytes + node.nbytes - old
        top.children[node.tokens[0]] = node
        node.parent = top
        self._nodes += 1
        return top

    # -- eviction -------------------------------------------------------------------------
    def _over(self) -> bool:
        return ((self.max_bytes is not None and self.nbytes > self.max_bytes)
                or (self.max_tokens is not None and self.tokens > self.max_tokens))

    def _evict(self) -> None:
        if not self._over():
            return
        heap: list[tuple[int, int, _Node]] = []
        stack = [self._root]
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            if node is not self._root and not node.children and node.locks == 0:
                heap.append((node.last_used, node.id, node))
        heapq.heapify(heap)
        while self._over() and heap:
            _, _, node = heapq.heappop(heap)
            parent = node.parent
            assert parent is not None
            del parent.children[node.tokens[0]]
            node.parent = None
            self._nodes -= 1
            self.nbytes -= node.nbytes
            self.tokens -= len(node.tokens)
            self.evictions += 1
            if parent is not self._root and not parent.children and parent.locks == 0:
                heapq.heappush(heap, (parent.last_used, parent.id, parent))

    def stats(self) -> dict[str, Any]:
        return {"nodes": len(self), "tokens": self.tokens, "bytes": self.nbytes,
                "lookups": self.lookups, "hits": self.hits, "reused_tokens": self.reused_tokens,
                "evictions": self.evictions}


def weights_fingerprint(model: torch.nn.Module) -> tuple:
    """Changes whenever a parameter is modified in place (an optimizer step, `load_state_dict`)
    or replaced: each tensor's storage address and autograd version counter. Costs one pass
    over the parameter list, not over the weights."""
    return tuple((p.data_ptr(), p._version) for p in model.parameters())
