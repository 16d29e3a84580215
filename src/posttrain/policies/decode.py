"""The batched decode loop behind `TorchPolicy`: prefill once, then one token per step.

A hand-written loop over the model's own KV cache, not `model.generate()`: the loop needs
per-row settings (temperature, top-p, max tokens, seed, stop check) that `generate()` takes only
per batch, and it returns exactly the log-probs a trainer recomputes. Speed is on par with
`generate()` (transformers 5.x) and the cache makes it ~8x faster than recomputing the whole
prefix each step on the tiny model (`benchmarks/generation.py`).

Prompts are left-padded so every row's next token sits in the last column; position ids count
real tokens only, so a padded row computes exactly what it would alone (up to float rounding).
A prompt repeated in the batch (a GRPO group) is prefilled once and its cache copied to its
rows. Rows that finish are dropped from the cache.

Log-probs: each sampled token's log-probability under the *temperature-scaled* distribution,
`log_softmax(logits / T)`, taken **before** top-p truncation (a trainer recomputes exactly this
from the same temperature; the top-p renormalisation is not differentiable and is not included).
Greedy rows (T = 0) report `log_softmax(logits)`, i.e. T = 1.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class RowSpec:
    """One row to complete."""

    prompt_ids: list[int]
    temperature: float
    top_p: float
    max_tokens: int
    seed: int | None = None


@dataclass
class RowResult:
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str = ""
    """'stop' (EOS or a stop string), 'length' (max_tokens or the model's context)"""
    reused_tokens: int = 0
    """prompt tokens whose keys/values came from a prefix cache instead of the prefill"""


def cache_kwarg(model: torch.nn.Module) -> str:
    """The forward() keyword that takes the KV cache ('cache' in transformers >= 5.x, else
    'past_key_values')."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def output_cache(out: Any) -> Any:
    """The KV cache a forward pass returned (under either name)."""
    cache = out.get("cache") if hasattr(out, "get") else None
    return cache if cache is not None else out.get("past_key_values")


def sampling_dist(logits: torch.Tensor, temps: torch.Tensor, top_ps: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-probs as documented above, the unnormalised probabilities sampled from: top-p
    applied), one row per logits row. Speculative decoding verifies drafts against exactly this."""
    logits = logits.float()
    greedy = temps <= 0
    scaled = logits / torch.where(greedy, torch.ones_like(temps), temps)[:, None]
    logp = torch.log_softmax(scaled, dim=-1)
    probs = logp.exp()
    if bool((top_ps < 1).any()):
        sorted_p, order = probs.sort(dim=-1, descending=True)
        # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
        drop = (sorted_p.cumsum(-1) - sorted_p) >= top_ps[:, None]
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
    return logp, probs


def sample_next(logits: torch.Tensor, temps: torch.Tensor, top_ps: torch.Tensor,
                generators: list[torch.Generator | None]) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick one token per row; returns (tokens [B], log-probs [B]) as documented above."""
    greedy = temps <= 0
    logp, probs = sampling_dist(logits, temps, top_ps)
    tokens = probs.argmax(dim=-1)
    sampled_rows = (~greedy).nonzero().flatten().tolist()
    shared = [i for i in sampled_rows if generators[i] is None]
    if shared:  # the global torch RNG, one call for all unseeded rows
        tokens[shared] = torch.multinomial(probs[shared], 1).flatten()
    for i in sampled_rows:
        if generators[i] is not None:
            tokens[i] = torch.multinomial(probs[i:i + 1], 1, generator=generators[i]).flatten()[0]
    return tokens, logp.gather(-1, tokens[:, None]).flatten()


def keep_last(model: torch.nn.Module, n: int) -> dict[str, int]:
    """forward() keywords that compute logits for the last `n` positions only (a large
    vocabulary makes the others costly), when the model takes `logits_to_keep`."""
    takes = "logits_to_keep" in inspect.signature(model.forward).parameters
    return {"logits_to_keep": n} if takes else {}


def left_pad(seqs: Sequence[Sequence[int]], pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, attention mask), each row right-aligned, on the CPU."""
    width = max(map(len, seqs))
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for r, seq in enumerate(seqs):
        ids[r, width - len(seq):] = torch.tensor(list(seq), dtype=torch.long)
        mask[r, width - len(seq):] = 1
    return ids, mask


def positions_of(mask: torch.Tensor) -> torch.Tensor:
    """Position ids that count real tokens only (a padded row computes what it would alone)."""
    return (mask.cumsum(-1) - 1).clamp(min=0)


def _prefill(model: torch.nn.Module, prompts: list[list[int]], pad_id: int, use_cache: bool,
             dedup: bool = True, extra: dict[str, Any] | None = None
             ) -> tuple[torch.Tensor, Any, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Run the prompts once; returns (last logits, cache, ids, mask, positions), one row each.

    GRPO samples a group of completions per prompt, so a batch repeats each prompt many times:
    each distinct prompt is computed once and its cache rows are then copied to every row that
    asked for it (when the cache can select rows; otherwise every row is computed). `extra`:
    more forward() inputs for every row (a vision model's pixel values); ids alone do not tell
    such prompts apart, so each row is then computed."""
    device = next(model.parameters()).device
    distinct: dict[tuple[int, ...], int] = {}
    row_of = [distinct.setdefault(tuple(p), len(distinct)) for p in prompts]
    dedup = dedup and use_cache and len(distinct) < len(prompts) and not extra
    unique = [list(p) for p in distinct] if dedup else prompts
    ids, mask = (t.to(device) for t in left_pad(unique, pad_id))
    positions = positions_of(mask)
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=use_cache,
                **keep_last(model, 1), **{k: v.to(device) for k, v in (extra or {}).items()})
    cache = output_cache(out) if use_cache else None
    logits = out.logits[:, -1, :]
    if dedup:
        if cache is None or not hasattr(cache, "batch_select_indices"):  # this cache cannot copy rows
            return _prefill(model, prompts, pad_id, use_cache, dedup=False)
        index = torch.tensor(row_of, device=device)
        cache.batch_select_indices(index)  # a repeated index copies the row
        logits, ids, mask, positions = logits[index], ids[index], mask[index], positions[index]
    return logits, cache, ids, mask, positions


@torch.inference_mode()
def start_rows(rows: Sequence[Any], max_positions: int | None) -> tuple[list[RowResult], list[int]]:
    """One empty result per row, and the indices of the rows that can generate: a prompt that
    already fills the context ends with finish_reason 'context' (the caller turns it into a
    per-request error; nothing to generate)."""
    results = [RowResult() for _ in rows]
    todo = []
    for i, row in enumerate(rows):
        if max_positions is not None and len(row.prompt_ids) >= max_positions:
            results[i].finish_reason = "context"
        else:
            todo.append(i)
    return results, todo


def token_limit(row: Any, max_positions: int | None) -> int:
    """How many tokens a row may generate: its `max_tokens`, cut to what the context has left."""
    if max_positions is None:
        return int(row.max_tokens)
    return min(row.max_tokens, max_positions - len(row.prompt_ids))


@torch.inference_mode()  # no autograd graph: with one, every step's activations stayed alive
def decode(model: torch.nn.Module, rows: list[RowSpec], *, pad_id: int, eos_ids: set[int],
           max_positions: int | None, stop_check: Callable[[int, list[int]], bool] | None = None,
           use_cache: bool = True, prefill_inputs: dict[str, Any] | None = None,
           never: Sequence[int] = ()) -> list[RowResult]:
    """Complete every row. `stop_check(row_index, generated_ids)` returns True when a stop
    string has appeared (the caller trims the text); EOS ids end a row with the EOS kept in
    `token_ids` (a trainer must see the stop decision) but never in the text.
    `prefill_inputs`: more inputs of the prompt pass, batched over the rows in order (a vision
    model's image tensors; every row must fit the context then); `never`: token ids no row may
    sample (image placeholders), out of the distribution the log-probs describe."""
    device = next(model.parameters()).device
    results, todo = start_rows(rows, max_positions)
    if not todo:
        return results

    temps = torch.tensor([rows[i].temperature for i in todo], dtype=torch.float32, device=device)
    top_ps = torch.tensor([rows[i].top_p for i in todo], dtype=torch.float32, device=device)
    gens: list[torch.Generator | None] = []
    for i in todo:
        seed = rows[i].seed
        gens.append(None if seed is None else torch.Generator(device=device).manual_seed(seed))
    limit = [token_limit(rows[i], max_positions) for i in todo]

    # batch row r currently holds todo[slot[r]]; finished rows are dropped when the cache can
    # drop rows, else they ride along (their samples are ignored).
    slot = list(range(len(todo)))
    done = [False] * len(todo)
    if prefill_inputs and (len(todo) < len(rows) or not use_cache):
        # the inputs are batched over all rows, and only the prompt pass takes them
        raise ValueError("decode: prefill_inputs need use_cache and every row fitting the context")
    logits, cache, ids, mask, positions = _prefill(model, [rows[i].prompt_ids for i in todo], pad_id,
                                                   use_cache, extra=prefill_inputs)
    kw, last = cache_kwarg(model), keep_last(model, 1)
    banned = torch.tensor(list(never), dtype=torch.long, device=device) if never else None
    while True:
        if banned is not None:
            logits = logits.index_fill(-1, banned, float("-inf"))
        tokens, logps = sample_next(logits, temps, top_ps, [gens[s] for s in slot])
        tok_list, logp_list = tokens.tolist(), logps.tolist()
        for r, s in enumerate(slot):
            if done[r]:
                continue
            res = results[todo[s]]
            tok = tok_list[r]
            res.token_ids.append(tok)
            res.logprobs.append(logp_list[r])
            if tok in eos_ids or (stop_check is not None and stop_check(todo[s], res.token_ids)):
                res.finish_reason = "stop"
            elif len(res.token_ids) >= limit[s]:
                res.finish_reason = "length"
            done[r] = bool(res.finish_reason)
        if all(done):
            return results
        can_prune = not use_cache or hasattr(cache, "batch_select_indices")
        if can_prune and any(done):
            keep = torch.tensor([r for r in range(len(slot)) if not done[r]], device=device)
            if use_cache:
                cache.batch_select_indices(keep)
            slot = [slot[r] for r in keep.tolist()]
            done = [False] * len(slot)
            ids, mask, tokens = ids[keep], mask[keep], tokens[keep]
            positions, temps, top_ps = positions[keep], temps[keep], top_ps[keep]
        new = tokens[:, None]
        ids = torch.cat([ids, new], dim=1)
        mask = torch.cat([mask, torch.ones_like(new)], dim=1)
        if use_cache:
            positions = positions[:, -1:] + 1
            out = model(input_ids=new, attention_mask=mask, position_ids=positions, use_cache=True,
                        **{kw: cache}, **last)
            cache = output_cache(out)
        else:
            positions = positions_of(mask)
            out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False,
                        **last)
        logits = out.logits[:, -1, :]


def cut_at_stop(text_of: Callable[[Sequence[int]], str], ids: list[int], logprobs: list[float],
                stops: Sequence[str]) -> tuple[str, list[int], list[float]]:
    """A finished row's text, tokens and log-probs, given its stop strings.

    The text is cut *before* the first stop string; the tokens are kept up to and *including* the
    one that completed it (as vLLM reports `token_ids`). The stop string is the model's decision
    to end its turn -- a closing tag like `</bash>` ends every tool call -- so a trainer must see
    those tokens and train them, and the next turn's prompt (token-in/token-out) continues from
    exactly what was sampled. Decoding ran at most a few tokens past the stop (speculative steps
    accept several); those are dropped."""
    text = text_of(ids)
    found = [i for i in (text.find(s) for s in stops if s) if i >= 0]
    if not found:
        return text, ids, logprobs
    n = len(ids)
    while n > 1 and any(s and s in text_of(ids[:n - 1]) for s in stops):
        n -= 1  # the shortest prefix whose text still holds a stop string
    return text[:min(found)], ids[:n], logprobs[:n]
