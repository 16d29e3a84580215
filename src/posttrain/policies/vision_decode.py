"""`VisionPolicy`'s decode loop with a prefix cache: an episode's next turn reuses the keys and
values of its earlier turns, pictures included, and never those of another picture.

Image positions all hold the same placeholder id, so a prompt's ids do not say which picture
fills them. The cache is therefore keyed by **key ids**: the prompt's ids with every position
of an image replaced by `-1 - int(sha256, 16)` of that image (a negative number no token has).
Two prompts with the same text but different pictures share keys up to the first image
position and no further; the same picture again shares everything. `PrefixCache` works on key
ids unchanged (they are ints), so its lookup, eviction and weight checks apply as they are.

A reused prefix never ends inside an image (its remaining positions would need part of the
image's features): it is cut back to the image's first position, and the image is recomputed
with the rest of the prompt. The prompt pass then feeds, per row, the ids after the reused
prefix and the image tensors of exactly the images whose positions lie there
(`ragged.RaggedBatch` carries each row's reused keys/values, whatever their lengths). After it,
one token per row per step, as `decode.decode` does (same sampling, log-probs, stop checks,
banned placeholder ids); a finished row's computed keys/values go into the cache under its key
ids.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from posttrain.policies.decode import RowResult, RowSpec, sample_next, start_rows, token_limit
from posttrain.policies.prefix_cache import PrefixCache
from posttrain.policies.ragged import RaggedBatch
from posttrain.values.image import Image


def image_key(img: Image) -> int:
    """The key id of every position of `img`: the whole SHA-256, negated below any token id."""
    return -1 - int(img.sha256, 16)


def key_ids(ids: Sequence[int], images: Sequence[Image], counts: Sequence[int], placeholders: set[int]
            ) -> tuple[list[int], list[tuple[int, int]]]:
    """(key ids of `ids`, each image's (first, last + 1) position span). `counts[i]`: how many
    placeholder positions image i fills (its positions need not be contiguous: a tiled image
    has row markers between its tiles). Raises ValueError when the ids hold another number of
    placeholders than the images fill."""
    if sum(counts) != sum(1 for t in ids if t in placeholders):
        raise ValueError(f"prompt holds {sum(1 for t in ids if t in placeholders)} image positions, its "
                         f"{len(images)} image(s) fill {sum(counts)}")
    if any(c < 1 for c in counts):
        raise ValueError(f"every image fills at least one position, got counts {list(counts)}")
    keys, spans = list(ids), []
    at, left, first = 0, 0, 0
    for pos, tok in enumerate(ids):
        if tok not in placeholders:
            continue
        if left == 0:  # the next image starts here
            left, first, at = counts[at], pos, at + 1
        keys[pos] = image_key(images[at - 1])
        left -= 1
        if left == 0:
            spans.append((first, pos + 1))
    return keys, spans


def reusable(n: int, spans: Sequence[tuple[int, int]]) -> int:
    """`n` cut back so that no image is split: a prefix ends before an image or after it."""
    for first, end in spans:
        if first < n < end:
            return first
    return n


@torch.inference_mode()
def decode_reusing(model: torch.nn.Module, rows: list[RowSpec], *, keys: Sequence[Sequence[int]],
                   spans: Sequence[Sequence[tuple[int, int]]], images: Sequence[Sequence[Image]],
                   image_inputs: Callable[[Sequence[Image]], dict[str, Any]], cache: PrefixCache,
                   pad_id: int, eos_ids: set[int], max_positions: int | None,
                   stop_check: Callable[[int, list[int]], bool] | None = None,
                   never: Sequence[int] = ()) -> list[RowResult]:
    """Complete every row like `decode.decode`, each prompt starting from its longest cached
    prefix (`keys[i]`, `spans[i]`, `images[i]`: row i's key ids, image spans and images)."""
    device = next(model.parameters()).device
    results, todo = start_rows(rows, max_positions)
    if not todo:
        return results
    limit = {i: token_limit(rows[i], max_positions) for i in todo}

    # the prompt pass: each distinct (key ids, reused length) once, from the cache where it can
    distinct: dict[tuple, int] = {}
    starts: list[tuple[list[int], Any, list[int], list[Image]]] = []
    row_of = []
    for i in todo:
        prompt = rows[i].prompt_ids
        found, kv = cache.lookup(keys[i], limit=len(prompt) - 1)
        n = reusable(found, spans[i])
        if kv is not None and n < found:
            kv = [(k[:, :n], v[:, :n]) for k, v in kv] if n else None
        results[i].reused_tokens = n
        key = (tuple(keys[i]), n)
        if key not in distinct:
            distinct[key] = len(starts)
            fresh = [img for img, (first, _) in zip(images[i], spans[i]) if first >= n]
            starts.append((prompt[:n], kv, prompt[n:], fresh))
        row_of.append(distinct[key])
    batch = RaggedBatch(model, pad_id, [(p, kv) for p, kv, _, _ in starts])
    shown = [img for *_, fresh in starts for img in fresh]
    logits, _ = batch.forward([rest for _, _, rest, _ in starts], extra=image_inputs(shown) if shown else None)
    last = logits[:, -1, :][torch.tensor(row_of, device=device)]
    batch.select(row_of)

    slot = list(todo)  # batch row r completes rows[slot[r]]
    t = lambda x: torch.tensor(x, dtype=torch.float32, device=device)  # noqa: E731
    temps, top_ps = t([rows[i].temperature for i in slot]), t([rows[i].top_p for i in slot])
    gens = [None if (s := rows[i].seed) is None else torch.Generator(device=device).manual_seed(s)
            for i in slot]
    banned = torch.tensor(list(never), dtype=torch.long, device=device) if never else None
    while True:
        if banned is not None:
            last = last.index_fill(-1, banned, float("-inf"))
        tokens, logps = sample_next(last, temps, top_ps, gens)
        done = []
        for r, (tok, lp) in enumerate(zip(tokens.tolist(), logps.tolist())):
            i, res = slot[r], results[slot[r]]
            res.token_ids.append(tok)
            res.logprobs.append(lp)
            if tok in eos_ids or (stop_check is not None and stop_check(i, res.token_ids)):
                res.finish_reason = "stop"
            elif len(res.token_ids) >= limit[i]:
                res.finish_reason = "length"
            done.append(bool(res.finish_reason))
        pending = tokens.tolist()
        if any(done):
            for r in (r for r in range(len(slot)) if done[r]):
                prompt = rows[slot[r]].prompt_ids  # completions hold no placeholder: their keys are their ids
                cache.insert(list(keys[slot[r]]) + batch.fed[r][len(prompt):], batch.row_kv(r))
            keep = [r for r in range(len(slot)) if not done[r]]
            if not keep:
                return results
            batch.select(keep)
            slot, pending = [slot[r] for r in keep], [pending[r] for r in keep]
            index = torch.tensor(keep, device=device)
            temps, top_ps, gens = temps[index], top_ps[index], [gens[r] for r in keep]
            batch.compact()
        logits, _ = batch.forward([[tok] for tok in pending])
        last = logits[:, -1, :]
