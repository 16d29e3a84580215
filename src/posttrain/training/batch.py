"""From trajectories to token tensors, and the teacher-forced log-probs of a batch.

Each turn of a selected trajectory becomes one `Sample`: its prompt ids (what the policy was
conditioned on for that turn, as recorded), its generated ids, the sampler's log-probs, and the
trajectory's advantage. Training on turns as recorded, rather than re-rendering the episode,
means the trainer sees exactly the tokens the sampler saw (no re-tokenisation drift).

The loss mask is implicit: only generated tokens get a log-prob, prompt tokens (observations,
tool output) never do.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Sequence

import torch

from posttrain.rollout.trajectory import Trajectory


@dataclass
class Sample:
    prompt_ids: list[int]
    completion_ids: list[int]
    old_logprobs: list[float] | None
    advantage: float
    owner: int
    """index of the trajectory (within the step) this turn belongs to"""


def samples_from(trajectories: Sequence[Trajectory], advantages: Sequence[float]
                 ) -> tuple[list[Sample], int]:
    """One sample per turn that generated tokens; returns (samples, turns skipped).

    A turn without recorded token ids (a backend that does not expose them) or with an empty
    prompt cannot be trained on; it is skipped and counted."""
    samples, skipped = [], 0
    for owner, (traj, adv) in enumerate(zip(trajectories, advantages)):
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


def _supports_logits_to_keep(model: torch.nn.Module) -> bool:
    return "logits_to_keep" in inspect.signature(model.forward).parameters


def sequence_logprobs(model: torch.nn.Module, samples: Sequence[Sample], *, temperature: float,
                      with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs of every generated token of `samples`, flat, in sample order, computed as the
    sampler does: log_softmax(logits / temperature). Differentiable unless under no_grad.

    Rows are left-padded, so each row's generated tokens are its last columns and only the
    last (longest completion + 1) positions need logits (`logits_to_keep`, when the model
    takes it). Returns (log-probs, per-token entropy or None)."""
    device = next(model.parameters()).device
    seqs = [s.prompt_ids + s.completion_ids for s in samples]
    width = max(map(len, seqs))
    keep = max(len(s.completion_ids) for s in samples)
    ids = torch.zeros((len(seqs), width), dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    valid = torch.zeros((len(seqs), keep), dtype=torch.bool)
    for i, (seq, s) in enumerate(zip(seqs, samples)):
        ids[i, width - len(seq):] = torch.tensor(seq, dtype=torch.long)
        mask[i, width - len(seq):] = 1
        valid[i, keep - len(s.completion_ids):] = True
    ids, mask, valid = ids.to(device), mask.to(device), valid.to(device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    kwargs = {"logits_to_keep": keep + 1} if _supports_logits_to_keep(model) else {}
    logits = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False,
                   **kwargs).logits
    logits = logits[:, -(keep + 1):-1, :].float() / temperature  # predicts the last `keep` ids
    logp_all = torch.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, ids[:, -keep:, None]).squeeze(-1)
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = -(logp_all.exp() * logp_all).sum(-1)[valid]
    return logp[valid], entropy
