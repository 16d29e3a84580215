"""Where speculative decoding's draft tokens come from (`posttrain.policies.speculative`).

Two drafters, one batched interface (`start`, `propose`, `commit`, `select`):

* `PromptLookup` -- no model at all: the row's last n tokens (n from `max_ngram` down to
  `min_ngram`) are looked up in everything the row has seen so far (prompt and completion), and
  the tokens that followed their latest earlier occurrence are the draft. Agent turns copy a
  lot (file contents, paths, test names, earlier code), so this drafts well exactly where output
  is predictable and proposes nothing elsewhere (then a step costs what a standard step costs).
  A match close to the end copies through its own draft, so a repeating pattern drafts in full.
* `DraftModel` -- a small causal LM with the same tokenizer (e.g. `models/tiny-base-draft`,
  made by `models/distill_draft.py`) proposes `k` tokens autoregressively on its own KV cache;
  its distribution `q` is returned for the rejection test of sampled rows.

Drafts are proposals only: the target model decides every token, so a bad drafter costs speed,
never correctness.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from posttrain.policies.decode import sampling_dist
from posttrain.policies.ragged import RaggedBatch

Drafts = tuple[list[list[int]], list[torch.Tensor | None]]
"""per row: the draft tokens, and the draft distribution q [len(draft), vocab] (None: one-hot on
the draft, i.e. a deterministic drafter, or a greedy row, whose test needs no q)"""


class PromptLookup:
    """n-gram copy drafting over each row's own prompt and history."""

    def __init__(self, max_ngram: int = 4, min_ngram: int = 3) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"PromptLookup needs 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.seqs: list[list[int]] = []
        self.index: list[dict[tuple[int, ...], int]] = []
        """per row: n-gram -> the position right after its latest occurrence that has a follower"""

    def _register(self, row: int, i: int) -> None:
        seq, index = self.seqs[row], self.index[row]
        for n in range(self.min_ngram, min(self.max_ngram, i) + 1):
            index[tuple(seq[i - n:i])] = i

    def start(self, seqs: Sequence[Sequence[int]], temps: Sequence[float], top_ps: Sequence[float],
              generators: Sequence[torch.Generator | None]) -> None:
        self.seqs, self.index = [], []
        self.add(seqs)

    def add(self, seqs: Sequence[Sequence[int]], temps: Sequence[float] = (), top_ps: Sequence[float] = (),
            generators: Sequence[torch.Generator | None] = ()) -> None:
        """Rows that join after the ones there (a continuous-batching server's new requests);
        their sampling settings do not matter to a deterministic drafter."""
        for seq in seqs:
            self.seqs.append(list(seq))
            self.index.append({})
            for i in range(1, len(seq)):
                self._register(len(self.seqs) - 1, i)

    def draft(self, row: int, budget: int) -> list[int]:
        seq = self.seqs[row]
        if budget <= 0:
            return []
        for n in range(min(self.max_ngram, len(seq)), self.min_ngram - 1, -1):
            at = self.index[row].get(tuple(seq[-n:]))
            if at is None:
                continue
            out: list[int] = []
            for j in range(budget):  # copying may run into its own draft: p + j >= len(seq)
                pos = at + j
                out.append(seq[pos] if pos < len(seq) else out[pos - len(seq)])
            return out
        return []

    def propose(self, budgets: Sequence[int]) -> Drafts:
        return [self.draft(r, b) for r, b in enumerate(budgets)], [None] * len(budgets)

    def commit(self, row: int, accepted: int, emitted: Sequence[int]) -> None:
        """The row's next tokens are `emitted` (its first `accepted` drafts, then one more)."""
        for tok in emitted:
            self.seqs[row].append(tok)
            self._register(row, len(self.seqs[row]) - 1)

    def select(self, keep: Sequence[int]) -> None:
        self.seqs = [self.seqs[i] for i in keep]
        self.index = [self.index[i] for i in keep]


class DraftModel:
    """A small causal LM as the drafter, batched over the rows on its own ragged KV cache."""

    def __init__(self, model: torch.nn.Module, pad_id: int) -> None:
        self.model, self.pad_id = model.eval(), pad_id
        self.batch: RaggedBatch | None = None
        self.backlog: list[list[int]] = []
        """per row: tokens of its sequence the draft model has not computed yet"""
        self.full: list[list[int]] = []  # the last proposal of each row
        self.budgets: list[int] = []
        self.k = 0
        self.temps: list[float] = []
        self.top_ps: list[float] = []
        self.gens: list[torch.Generator | None] = []

    def start(self, seqs: Sequence[Sequence[int]], temps: Sequence[float], top_ps: Sequence[float],
              generators: Sequence[torch.Generator | None]) -> None:
        self.batch = RaggedBatch(self.model, self.pad_id, [([], None)] * len(seqs))
        self.backlog = [list(s) for s in seqs]
        self.temps, self.top_ps, self.gens = list(temps), list(top_ps), list(generators)
        self.full, self.budgets, self.k = [[] for _ in seqs], [0] * len(seqs), 0

    def add(self, seqs: Sequence[Sequence[int]], temps: Sequence[float], top_ps: Sequence[float],
            generators: Sequence[torch.Generator | None]) -> None:
        """Rows that join after the ones there (a continuous-batching server's new requests):
        the rows in flight keep their keys/values, the new ones start empty (their sequence is
        their backlog, computed by the next `propose`)."""
        if len(temps) != len(seqs) or len(top_ps) != len(seqs) or len(generators) != len(seqs):
            raise ValueError("DraftModel.add: one temperature, top_p and generator per sequence")
        old = self.batch
        prefixes = [] if old is None else [(old.fed[r], old.row_kv(r) if old.fed[r] else None)
                                           for r in range(len(old))]
        self.batch = RaggedBatch(self.model, self.pad_id, prefixes + [([], None)] * len(seqs))
        self.backlog += [list(s) for s in seqs]
        self.temps += list(temps)
        self.top_ps += list(top_ps)
        self.gens += list(generators)
        self.full += [[] for _ in seqs]
        self.budgets += [0] * len(seqs)  # nothing proposed yet: `commit` retracts nothing

    def _pick(self, logits: torch.Tensor, rows: Sequence[int]) -> tuple[dict[int, int], dict[int, torch.Tensor | None]]:
        """The next draft token (and q for sampled rows) of each row in `rows`."""
        device = logits.device
        temps = torch.tensor(self.temps, dtype=torch.float32, device=device)
        top_ps = torch.tensor(self.top_ps, dtype=torch.float32, device=device)
        _, probs = sampling_dist(logits, temps, top_ps)
        greedy = probs.argmax(dim=-1).tolist()
        tokens: dict[int, int] = {}
        qs: dict[int, torch.Tensor | None] = {}
        for r in rows:
            tokens[r], qs[r] = greedy[r], None
            if self.temps[r] > 0:
                q = probs[r] / probs[r].sum()
                tokens[r] = int(torch.multinomial(q, 1, generator=self.gens[r])[0])
                qs[r] = q
        return tokens, qs

    @torch.inference_mode()
    def propose(self, budgets: Sequence[int]) -> Drafts:
        assert self.batch is not None, "DraftModel.propose before start"
        self.budgets = list(budgets)
        self.full = [[] for _ in budgets]
        self.k = max(budgets, default=0)
        if self.k == 0:
            return [[] for _ in budgets], [None] * len(budgets)
        logits, _ = self.batch.forward(self.backlog)
        self.backlog = [[] for _ in budgets]
        qs: list[list[torch.Tensor | None]] = [[] for _ in budgets]
        for step in range(self.k):
            # a row drafts only up to its budget: past it, it feeds nothing (its positions may
            # not exist: the budget keeps drafts inside the model's context)
            rows = [r for r, b in enumerate(budgets) if step < b]
            tokens, q = self._pick(logits[:, -1, :], rows)
            for r in rows:
                self.full[r].append(tokens[r])
                qs[r].append(q[r])
            if step < self.k - 1:  # the last draft is proposed, not computed
                logits, _ = self.batch.forward([[tokens[r]] if step + 1 < b else []
                                                for r, b in enumerate(budgets)])
        qs_out = [torch.stack(q) if q and q[0] is not None else None for q in qs]  # type: ignore[arg-type]
        return [list(f) for f in self.full], qs_out

    def commit(self, row: int, accepted: int, emitted: Sequence[int]) -> None:
        assert self.batch is not None
        if self.k == 0:
            self.backlog[row].extend(emitted)
            return
        computed = max(0, self.budgets[row] - 1)  # drafts whose keys/values the draft model holds
        self.batch.retract(row, computed - min(accepted, computed))
        self.backlog[row].extend(self.full[row][computed:accepted])
        self.backlog[row].append(emitted[-1])

    def select(self, keep: Sequence[int]) -> None:
        if not keep:  # every row left: the next `add` starts afresh
            self.batch, self.backlog, self.full, self.budgets = None, [], [], []
            self.temps, self.top_ps, self.gens = [], [], []
            return
        assert self.batch is not None, "DraftModel.select before start"
        self.batch.select(keep)
        self.backlog = [self.backlog[i] for i in keep]
        self.full = [self.full[i] for i in keep]
        self.budgets = [self.budgets[i] for i in keep]
        self.temps = [self.temps[i] for i in keep]
        self.top_ps = [self.top_ps[i] for i in keep]
        self.gens = [self.gens[i] for i in keep]
        self.batch.compact()
