"""Fast mode's draft verification for `BatchEngine` (see `engine.py`'s module docstring): after
one forward has fed every row its new token plus its draft, decide per row how much of the draft
standard decoding would have produced, emit those tokens, and retract the rest from the row's KV
cache. Kept apart from the decode loop because it is the one place the speculative acceptance
rules (greedy agreement, `speculative.accept_sampled`'s rejection test) meet the batch."""

from __future__ import annotations

from collections.abc import Callable

import torch

from posttrain.policies.decode import sampling_dist
from posttrain.policies.ragged import RaggedBatch
from posttrain.policies.server.rows import EngineStats, Row
from posttrain.policies.speculative import accept_sampled


def verify_drafts(rows: list[Row], batch: RaggedBatch, drafts: list[list[int]],
                  qs: list[torch.Tensor | None], logits: torch.Tensor, lengths: list[int], *,
                  emit: Callable[[Row, int, float], None], max_draft: int,
                  stats: EngineStats) -> torch.Tensor:
    """Accept each row's draft while the token standard decoding picks (or samples) at that
    position agrees -- or, for a sampled row with a draft model's distribution `q`, by the
    rejection test (`speculative.accept_sampled`); `emit` records each accepted or corrected
    token on its row. Returns every row's next-token logits (stale for a row whose next token
    is already `pending`)."""
    width = logits.shape[1]
    nxt = []
    for r, (row, d) in enumerate(zip(rows, drafts)):
        off = width - lengths[r]
        if not d:
            nxt.append(logits[r, -1])
            continue
        temp = torch.full((len(d) + 1,), float(row.sampling.temperature), device=logits.device)
        top_p = torch.full((len(d) + 1,), float(row.sampling.top_p), device=logits.device)
        logp, probs = sampling_dist(logits[r, off:off + len(d) + 1], temp, top_p)
        a = 0
        q = qs[r]
        if q is not None and row.sampling.temperature > 0:
            a, x = accept_sampled(probs, d, q, row.generator)
            for i, tok in enumerate(d[:a] + [x]):
                emit(row, tok, float(logp[i, tok]))
            row.pending = x  # emitted; fed with the next step's forward
        while q is None and a < len(d) and not row.finish:
            if row.sampling.temperature <= 0:
                x = int(probs[a].argmax())
            else:
                x = int(torch.multinomial(probs[a:a + 1], 1, generator=row.generator)[0, 0])
            emit(row, x, float(logp[a, x]))
            if x != d[a]:
                row.pending = x  # emitted; fed with the next step's forward
                break
            a += 1
        stats.drafted += len(d)
        stats.accepted += a
        batch.retract(r, len(d) - a)
        row.draft, row.accepted = d, a
        row.depth = min(max_draft, 2 * row.depth) if a == len(d) else max(1, a)
        nxt.append(logits[r, off + a])
    batch.compact()
    return torch.stack(nxt)
