"""Speculative decoding, batched, and the prefix cache's decode loop (`TorchPolicy` fast mode).

Each step, every row feeds its pending token plus the drafter's proposals (`drafters.py`) in
**one** target forward (`ragged.RaggedBatch`: rows feed different numbers of tokens); the
target's own distribution at each position then decides:

* **greedy rows** accept a draft token while it equals the token standard decoding would pick
  from the same logits (`decode.sample_next`, the very function), and the first disagreement
  is replaced by the target's pick; when all drafts pass, the last position gives one more
  token. The output is the standard output token for token; only the float rounding of a
  wider forward could differ, which the tests and `benchmarks/fast_mode.py` check on thousands
  of prompts.
* **sampled rows** use rejection sampling (Leviathan et al. 2023; Chen et al. 2023): draft `d`
  with draft probability `q(d)` is accepted with probability `min(1, p(d)/q(d))`, `p` the
  target's sampling distribution (temperature, then top-p: `decode.sampling_dist`); the first
  rejection samples from the residual `max(0, p - q)` renormalised, and a fully accepted draft
  samples one more token from `p`. Every emitted token is then distributed exactly as `p`. A
  deterministic drafter (prompt lookup) has `q` one-hot: accept with probability `p(d)`, else
  sample from `p` without `d`.

Everything standard decoding respects holds per emitted token, in order: EOS (kept, ends the
row), `stop_check` (called once per token, as `decode.decode` does), `max_tokens`, and the
model's context (drafts never run past the row's limit). Log-probs are the target's,
`log_softmax(logits / T)` at each emitted token's own position. Seeded rows draw every random
number (draft sampling, acceptance, residual) from their own generator, so a seed reproduces
its completion; it does not reproduce the standard mode's sample (the two consume randomness
differently).

With a `PrefixCache`, each row's prompt starts from its longest cached prefix and every row's
computed keys/values (prompt + completion) are stored when it finishes. With no drafter this
is standard decoding with reuse (one token per row per step).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from posttrain.policies.decode import RowResult, RowSpec, sample_next, sampling_dist, start_rows, token_limit
from posttrain.policies.prefix_cache import PrefixCache
from posttrain.policies.ragged import RaggedBatch


@dataclass
class SpecStats:
    """Counters over a policy's lifetime (`TorchPolicy.spec_stats`)."""

    row_steps: int = 0
    """(row, target forward) pairs after the prefill: each emits at least one token"""
    emitted: int = 0
    """tokens those steps emitted (accepted drafts + one per step)"""
    drafted: int = 0
    accepted: int = 0
    forwards: int = 0
    """target forwards after the prefill (a batch's step counts once)"""

    @property
    def acceptance_len(self) -> float:
        """tokens per row per target forward: 1.0 is standard decoding"""
        return self.emitted / self.row_steps if self.row_steps else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"row_steps": self.row_steps, "emitted": self.emitted, "drafted": self.drafted,
                "accepted": self.accepted, "forwards": self.forwards,
                "acceptance_len": round(self.acceptance_len, 4)}


def accept_sampled(p: torch.Tensor, drafts: Sequence[int], q: torch.Tensor | None,
                   generator: torch.Generator | None) -> tuple[int, int]:
    """Rejection sampling of one row: `p` [len(drafts)+1, vocab] the target's probabilities
    (unnormalised), `q` [len(drafts), vocab] the draft's (None: one-hot on the drafts).
    Returns (drafts accepted, the token that follows them)."""
    p = p / p.sum(dim=-1, keepdim=True)
    for i, d in enumerate(drafts):
        qd = 1.0 if q is None else float(q[i, d])
        u = float(torch.rand((), generator=generator, device=p.device))
        if u * qd < float(p[i, d]):  # u < p/q without dividing by a q(d) of 0
            continue
        if q is None:
            residual = p[i].clone()
            residual[d] = 0.0
        else:
            residual = (p[i] - q[i]).clamp(min=0.0)
        if float(residual.sum()) <= 0.0:  # p == q up to rounding: any draw from p is exact
            residual = p[i]
        return i, int(torch.multinomial(residual, 1, generator=generator)[0])
    return len(drafts), int(torch.multinomial(p[len(drafts)], 1, generator=generator)[0])


@torch.inference_mode()
def generate(model: torch.nn.Module, rows: list[RowSpec], *, pad_id: int, eos_ids: set[int],
             max_positions: int | None, stop_check: Callable[[int, list[int]], bool] | None = None,
             drafter: Any = None, prefix_cache: PrefixCache | None = None, max_draft: int = 16,
             verify_tokens: int = 256, stats: SpecStats | None = None) -> list[RowResult]:
    """Complete every row, like `decode.decode`, speculatively when a drafter is given.

    `verify_tokens` caps the positions one verification forward computes (rows x width): a
    forward's cost is a fixed part plus a part per position, so a large batch gets short drafts
    (a batch of `verify_tokens` rows or more decodes one token per row, like standard)."""
    device = next(model.parameters()).device
    stats = stats if stats is not None else SpecStats()
    results, todo = start_rows(rows, max_positions)
    if not todo:
        return results
    limit = {i: token_limit(rows[i], max_positions) for i in todo}

    # Prefill: each distinct (prompt, reused prefix) once, from the prefix cache when it can.
    distinct: dict[tuple, int] = {}
    starts: list[tuple[list[int], Any, list[int]]] = []
    row_of = []
    for i in todo:
        prompt = rows[i].prompt_ids
        n, kv = prefix_cache.lookup(prompt, limit=len(prompt) - 1) if prefix_cache else (0, None)
        results[i].reused_tokens = n
        key = (tuple(prompt), n)
        if key not in distinct:
            distinct[key] = len(starts)
            starts.append((prompt[:n], kv, prompt[n:]))
        row_of.append(distinct[key])
    batch = RaggedBatch(model, pad_id, [(p, kv) for p, kv, _ in starts])
    logits, _ = batch.forward([rest for _, _, rest in starts])
    last = logits[:, -1, :][torch.tensor(row_of, device=device)]
    batch.select(row_of)

    slot = list(todo)  # batch row r completes rows[slot[r]]
    temps = [rows[i].temperature for i in slot]
    top_ps = [rows[i].top_p for i in slot]
    gens = [None if (s := rows[i].seed) is None else torch.Generator(device=device).manual_seed(s)
            for i in slot]

    def emit(r: int, tok: int, logp: float) -> bool:
        res = results[slot[r]]
        res.token_ids.append(tok)
        res.logprobs.append(logp)
        if tok in eos_ids or (stop_check is not None and stop_check(slot[r], res.token_ids)):
            res.finish_reason = "stop"
        elif len(res.token_ids) >= limit[slot[r]]:
            res.finish_reason = "length"
        return bool(res.finish_reason)

    t = lambda x: torch.tensor(x, dtype=torch.float32, device=device)  # noqa: E731
    first, first_logp = sample_next(last, t(temps), t(top_ps), gens)
    pending = first.tolist()
    done = [emit(r, tok, lp) for r, (tok, lp) in enumerate(zip(pending, first_logp.tolist()))]
    if drafter is not None:
        drafter.start([rows[i].prompt_ids + [pending[r]] for r, i in enumerate(slot)], temps, top_ps, gens)
    # per-row draft length: starts short, doubles while every draft is accepted, falls back to
    # what was accepted on a miss (a wrong draft costs a wider forward for nothing)
    depth = [min(4, max_draft)] * len(slot)

    while True:
        if any(done):
            if prefix_cache is not None:
                for r in (r for r in range(len(slot)) if done[r]):
                    prefix_cache.insert(batch.fed[r], batch.row_kv(r))
            keep = [r for r in range(len(slot)) if not done[r]]
            if not keep:
                return results
            batch.select(keep)
            if drafter is not None:
                drafter.select(keep)
            slot, pending, depth = [slot[r] for r in keep], [pending[r] for r in keep], [depth[r] for r in keep]
            done = [False] * len(keep)
            temps, top_ps, gens = [temps[r] for r in keep], [top_ps[r] for r in keep], [gens[r] for r in keep]
            batch.compact()
        cap = verify_tokens // len(slot) - 1
        budgets = [max(0, min(depth[r], cap, limit[i] - len(results[i].token_ids) - 1)) for r, i in enumerate(slot)]
        drafts, qs = drafter.propose(budgets) if drafter is not None else ([[] for _ in slot], [None] * len(slot))
        chunks = [[pending[r]] + drafts[r] for r in range(len(slot))]
        logits, lengths = batch.forward(chunks)
        width = logits.shape[1]
        stats.forwards += 1
        flat = logits.reshape(-1, logits.shape[-1])
        rep = lambda xs, width=width: t([x for x in xs for _ in range(width)])  # noqa: E731
        temps_t, top_ps_t = rep(temps), rep(top_ps)
        # one pass over every position: greedy picks are `sample_next`'s own (argmax of these)
        logp_all, probs = sampling_dist(flat, temps_t, top_ps_t)
        picks = probs.argmax(dim=-1)
        pick_lp = logp_all.gather(-1, picks[:, None]).view(len(slot), width).tolist()
        picks_all = picks.view(len(slot), width).tolist()
        logp_all, probs = logp_all.view(len(slot), width, -1), probs.view(len(slot), width, -1)
        sampled = [r for r in range(len(slot)) if temps[r] > 0]
        if sampled:  # log-prob of each fed draft token at the position that predicted it
            fed = torch.tensor([[pad_id] * (width - len(c)) + c for c in chunks], device=device)
            draft_lp = logp_all[:, :-1].gather(-1, fed[:, 1:, None]).squeeze(-1).tolist()
        for r in range(len(slot)):
            d, off = drafts[r], width - lengths[r]
            if temps[r] <= 0:
                picks = picks_all[r][off:]
                a = 0
                while a < len(d) and picks[a] == d[a]:
                    a += 1
                nxt = picks[a]
            else:
                a, nxt = accept_sampled(probs[r, off:], d, qs[r], gens[r])
            new = d[:a] + [nxt]
            if temps[r] <= 0:  # every emitted token is the pick at its position
                lps = pick_lp[r][off:off + a + 1]
            else:
                lps = draft_lp[r][off:off + a] + [float(logp_all[r, off + a, nxt])]
            stats.row_steps += 1
            stats.drafted += len(d)
            stats.accepted += a
            for tok, lp in zip(new, lps):
                stats.emitted += 1
                if emit(r, tok, lp):
                    done[r] = True
                    break
            batch.retract(r, len(d) - a)
            if drafter is not None and not done[r]:
                drafter.commit(r, a, new)
            pending[r] = nxt
            if d:
                depth[r] = min(max_draft, 2 * depth[r]) if a == len(d) else max(1, a)
        batch.compact()
