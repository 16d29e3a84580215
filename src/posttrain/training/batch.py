"""From trajectories to token tensors, and the teacher-forced log-probs of a batch.

A trajectory becomes `Sample`s holding exactly the ids the sampler saw and produced (no
re-tokenisation drift), the sampler's log-probs and the trajectory's advantage:

* **multi-turn, one sequence** (the field's way, when the episode ran token-in/token-out: each
  turn's prompt ids extend the previous turn's prompt + completion ids): the whole episode is one
  sample, `prompt_ids` (the first observation) followed by every turn's generated ids with the
  observation ids between them (`between`). Only the model's own tokens are trained: log-probs
  are taken at generated positions only (per turn, in order), observations and tool output are
  context. The history is computed once instead of once per turn;
* **one sample per turn** otherwise (turns whose prompts do not extend each other, e.g. a
  backend that re-rendered the history): each turn's recorded prompt and its generated ids.

Either way the loss mask is implicit: only generated tokens get a log-prob, prompt tokens
(observations, tool output) never do, and `completion_ids` holds exactly the trained tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from posttrain.policies.decode import cache_kwarg, keep_last, left_pad, output_cache, positions_of
from posttrain.values.trajectory import Trajectory


@dataclass
class Sample:
    prompt_ids: list[int]
    completion_ids: list[int]
    old_logprobs: list[float] | None
    advantage: float
    owner: int
    """index of the trajectory (within the step) this turn belongs to"""
    turn_lengths: list[int] | None = None
    """a merged multi-turn sample: generated ids per turn (they sum to len(completion_ids))"""
    between: list[list[int]] | None = None
    """a merged multi-turn sample: the observation ids that follow each turn but the last"""

    def tail(self) -> tuple[list[int], list[bool]]:
        """Everything after the prompt, and which of it the model generated (the loss mask)."""
        if not self.turn_lengths:
            return list(self.completion_ids), [True] * len(self.completion_ids)
        ids: list[int] = []
        mask: list[bool] = []
        at = 0
        for i, n in enumerate(self.turn_lengths):
            ids += self.completion_ids[at:at + n]
            mask += [True] * n
            at += n
            if i < len(self.turn_lengths) - 1:
                ids += self.between[i]  # type: ignore[index]
                mask += [False] * len(self.between[i])  # type: ignore[index]
        return ids, mask


def merged(traj: Trajectory, adv: float, owner: int) -> Sample | None:
    """The whole episode as one sample, or None unless every turn has token ids and each
    turn's prompt extends the previous prompt + completion (token-in/token-out)."""
    turns = traj.turns
    if len(turns) < 2 or any(not t.token_ids or not t.prompt_token_ids for t in turns):
        return None
    between = []
    for prev, nxt in zip(turns, turns[1:]):
        history = list(prev.prompt_token_ids) + list(prev.token_ids)  # type: ignore[arg-type]
        if list(nxt.prompt_token_ids[:len(history)]) != history:  # type: ignore[index]
            return None
        between.append(list(nxt.prompt_token_ids[len(history):]))  # type: ignore[index]
    if any(t.logprobs is not None and len(t.logprobs) != len(t.token_ids) for t in turns):  # type: ignore[arg-type]
        return None  # reported by the per-turn path below
    old = None if any(t.logprobs is None for t in turns) else [lp for t in turns for lp in t.logprobs]  # type: ignore[union-attr]
    return Sample(list(turns[0].prompt_token_ids), [i for t in turns for i in t.token_ids],  # type: ignore[arg-type, union-attr]
                  old, float(adv), owner, [len(t.token_ids) for t in turns], between)  # type: ignore[arg-type]


def samples_from(trajectories: Sequence[Trajectory], advantages: Sequence[float], *,
                 merge_turns: bool = True) -> tuple[list[Sample], int]:
    """The samples of a step (see the module docstring); returns (samples, turns skipped).

    A turn without recorded token ids (a backend that does not expose them) or with an empty
    prompt cannot be trained on; it is skipped and counted."""
    samples, skipped = [], 0
    for owner, (traj, adv) in enumerate(zip(trajectories, advantages)):
        whole = merged(traj, adv, owner) if merge_turns else None
        if whole is not None:
            samples.append(whole)
            continue
        for turn in traj.turns:
            if not turn.token_ids:
                skipped += turn.token_ids is None
                continue
            if not turn.prompt_token_ids:
                skipped += 1
                continue
            old = turn.logprobs
            if old is not None and len(old) != len(turn.token_ids):
                raise ValueError(f"trajectory {traj.id} turn {turn.index}: {len(old)} log-probs for "
                                 f"{len(turn.token_ids)} token ids")
            samples.append(Sample(list(turn.prompt_token_ids), list(turn.token_ids),
                                  None if old is None else list(old), float(adv), owner))
    return samples, skipped


def sequence_logprobs(model: torch.nn.Module, samples: Sequence[Sample], *, temperature: float,
                      with_entropy: bool = False, share_prompts: bool = True
                      ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs of every generated token of `samples`, flat, in sample order, computed as the
    sampler does: log_softmax(logits / temperature). Differentiable unless under no_grad.
    Returns (log-probs, per-token entropy or None).

    A GRPO batch repeats each prompt once per sample of its group. With `share_prompts` (and a
    model whose KV cache can select rows), each distinct prompt is run once, its cache copied to
    its samples, and only the completions are run on top: the gradient flows back through the
    shared cache into the one prompt pass. Same numbers as running every sequence whole (up to
    float rounding), a fraction of the compute when prompts are long and answers short."""
    distinct = {tuple(s.prompt_ids) for s in samples}
    if share_prompts and len(distinct) < len(samples):
        out = _shared_prompt_logits(model, samples)
        if out is not None:
            return _gather(out[0], out[1], out[2], temperature, with_entropy)
    return _gather(*_whole_sequence_logits(model, samples), temperature, with_entropy)


def _gather(logits: torch.Tensor, targets: torch.Tensor, valid: torch.Tensor, temperature: float,
            with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """logits [B, K, V] predicting targets [B, K]; valid [B, K] marks generated tokens."""
    logp_all = torch.log_softmax(logits.float() / temperature, dim=-1)
    logp = logp_all.gather(-1, targets[..., None]).squeeze(-1)
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = -(logp_all.exp() * logp_all).sum(-1)[valid]
    return logp[valid], entropy


def _whole_sequence_logits(model: torch.nn.Module, samples: Sequence[Sample]
                           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every sequence run whole, left-padded: each row's generated tokens are its last columns,
    so only the last (longest completion + 1) positions need logits (`logits_to_keep`)."""
    device = next(model.parameters()).device
    tails = [s.tail() for s in samples]
    ids, mask = (t.to(device) for t in left_pad([s.prompt_ids + t[0] for s, t in zip(samples, tails)]))
    keep = max(len(t[0]) for t in tails)
    valid = torch.zeros((len(samples), keep), dtype=torch.bool)
    for i, (_, gen) in enumerate(tails):
        valid[i, keep - len(gen):] = torch.tensor(gen, dtype=torch.bool)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=positions_of(mask), use_cache=False,
                   **keep_last(model, keep + 1)).logits
    return logits[:, -(keep + 1):-1, :], ids[:, -keep:], valid.to(device)


def _shared_prompt_logits(model: torch.nn.Module, samples: Sequence[Sample]
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """Distinct prompts once (left-padded), completions on their copied cache (right-padded).
    None when the model's cache cannot select rows."""
    device = next(model.parameters()).device
    index: dict[tuple[int, ...], int] = {}
    row_of = [index.setdefault(tuple(s.prompt_ids), len(index)) for s in samples]
    p_ids, p_mask = (t.to(device) for t in left_pad(list(index)))
    out = model(input_ids=p_ids, attention_mask=p_mask, position_ids=positions_of(p_mask), use_cache=True,
                **keep_last(model, 1))
    cache = output_cache(out)
    if not hasattr(cache, "batch_select_indices"):
        return None
    rows = torch.tensor(row_of, device=device)
    cache.batch_select_indices(rows)  # differentiable gather: a repeated index copies the row
    tails = [s.tail() for s in samples]
    keep = max(len(t[0]) for t in tails)
    c_ids = torch.zeros((len(samples), keep), dtype=torch.long)
    valid = torch.zeros((len(samples), keep), dtype=torch.bool)
    present = torch.zeros((len(samples), keep), dtype=torch.long)
    for i, (tail_ids, gen) in enumerate(tails):
        c_ids[i, :len(tail_ids)] = torch.tensor(tail_ids, dtype=torch.long)
        valid[i, :len(gen)] = torch.tensor(gen, dtype=torch.bool)
        present[i, :len(tail_ids)] = 1
    c_ids, valid = c_ids.to(device), valid.to(device)
    mask = torch.cat([p_mask[rows], present.to(device)], dim=1)
    positions = p_mask[rows].sum(-1, keepdim=True) + torch.arange(keep, device=device)[None, :]
    # padding after a short tail would count on past the row's end (a long prompt beside another
    # sample's long tail can pass the model's last position): masked columns sit at position 0
    positions = positions * present.to(device)
    logits = model(input_ids=c_ids, attention_mask=mask, position_ids=positions, use_cache=True,
                   **{cache_kwarg(model): cache}).logits
    # The prompt's last logits predict the first generated token; each generated token's
    # logits predict the next one.
    predicting = torch.cat([out.logits[:, -1:, :][rows], logits[:, :-1, :]], dim=1)
    return predicting, c_ids, valid
