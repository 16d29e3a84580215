"""The clipped policy-gradient loss of the GRPO family, per token, and its aggregation.

Per generated token t of a trajectory with advantage A:

    ratio_t = exp(logp_new_t - logp_old_t)
    pg_t    = max(-A * ratio_t, -A * clip(ratio_t, 1 - clip_low, 1 + clip_high))
    kl_t    = exp(logp_ref_t - logp_new_t) - (logp_ref_t - logp_new_t) - 1      (k3, >= 0)
    loss_t  = pg_t + kl_beta * kl_t

and the batch loss is sum_t w_t * loss_t, with token weights that sum to 1 over the whole step
(`token_weights`), so gradient accumulation over micro-batches is exact: each micro-batch
back-propagates its share and the sum is the full-batch gradient.

A token is *clipped* when the clipped term is the one chosen and differs from the unclipped one
(the gradient through it is zero); `clip_fraction` is the weighted share of such tokens.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

import torch


def token_weights(lengths: Sequence[int], owners: Sequence[int], agg: str,
                  extra: Collection[int] = ()) -> list[list[float]]:
    """Per-token weights for sequences of `lengths` tokens; `owners[i]` is the trajectory that
    sequence i belongs to (a multi-turn trajectory has one sequence per turn).

    'token'    -> every token 1 / (all tokens of the step);
    'sequence' -> 1 / (number of trajectories * tokens of its trajectory).

    The owners in `extra` (replayed successes, `posttrain.training.replay`) are weighed by the
    same formula but not counted in it: the others' weights are what they would be without them
    (they sum to 1), so a replay adds its term without diluting the step's policy gradient. When
    every owner is extra, they are counted.
    """
    if len(lengths) != len(owners):
        raise ValueError("token_weights: lengths and owners differ in length")
    counted = [o not in extra for o in owners]
    if not any(c and n for c, n in zip(counted, lengths)):
        counted = [True] * len(owners)
    if agg == "token":
        total = sum(n for n, c in zip(lengths, counted) if c)
        return [[1.0 / total] * n for n in lengths] if total else [[] for _ in lengths]
    if agg == "sequence":
        per_owner: dict[int, int] = {}
        for n, o in zip(lengths, owners):
            per_owner[o] = per_owner.get(o, 0) + n
        live = {o: n for o, n in per_owner.items() if n > 0}
        n_counted = len({o for o, c in zip(owners, counted) if c and o in live})
        return [[1.0 / (n_counted * live[o])] * n if n else [] for n, o in zip(lengths, owners)]
    raise ValueError(f"unknown loss aggregation {agg!r} (expected 'token' or 'sequence')")


@dataclass
class LossParts:
    loss: torch.Tensor
    """the weighted loss of these tokens (a share of the step's loss), differentiable"""
    pg: float
    kl: float
    """weighted k3 KL (0 without a reference)"""
    kl_tokens: torch.Tensor | None
    """each token's k3 KL, detached (None without a reference): for figures over a subset of the
    tokens (the trainer's `kl` and `anchor_kl`)"""
    clip_fraction: float
    ratio_max: float
    """the largest ratio among the tokens the policy gradient acts on (advantage != 0: a KL anchor's
    samples, `TrainerConfig.kl_anchor_domains`, were sampled steps ago and carry none)"""


def clipped_pg_loss(new_logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                    weights: torch.Tensor, *, clip_low: float, clip_high: float,
                    ref_logp: torch.Tensor | None = None, kl_beta: float = 0.0,
                    is_weights: torch.Tensor | None = None) -> LossParts:
    """All arguments are flat tensors over the same tokens (padding has weight 0). `is_weights`
    (no gradient) multiplies each token's policy-gradient term: truncated importance sampling
    from the sampler's distribution to the trainer's (`TrainerConfig.tis_cap`)."""
    ratio = torch.exp(new_logp - old_logp)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    pg = torch.maximum(unclipped, clipped)
    if is_weights is not None:
        pg = pg * is_weights
    per_token = pg
    kl_value, kl_tokens = 0.0, None
    if ref_logp is not None and kl_beta > 0:
        delta = ref_logp - new_logp
        kl = torch.exp(delta) - delta - 1.0
        per_token = per_token + kl_beta * kl
        kl_tokens = kl.detach()
        kl_value = float((kl_tokens * weights).sum())
    is_clipped = (clipped > unclipped).float()
    return LossParts(
        loss=(per_token * weights).sum(),
        pg=float((pg.detach() * weights).sum()),
        kl=kl_value,
        kl_tokens=kl_tokens,
        clip_fraction=float((is_clipped * weights).sum()),
        ratio_max=float(acting.max()) if (acting := ratio.detach()[advantages != 0]).numel() else 1.0,
    )


def off_policy(trainer_logp: torch.Tensor, sampler_logp: torch.Tensor, weights: torch.Tensor,
               cap: float) -> tuple[torch.Tensor | None, dict[str, float]]:
    """The sampler/trainer mismatch over a step's tokens, and the truncated importance weights
    min(exp(trainer - sampler), cap) when `cap` > 0 (else None). Metrics are token-weighted
    means: `mismatch_abs_logp` |trainer - sampler|, `mismatch_kl` the k3 estimate of
    KL(sampler || trainer) from the sampler's own tokens (exp(d) - d - 1, d = trainer - sampler,
    >= 0), `tis_capped_share` the share of tokens whose weight the cap cut."""
    d = (trainer_logp - sampler_logp).detach()
    ratio = torch.exp(d)
    metrics = {"mismatch_abs_logp": float((d.abs() * weights).sum()),
               "mismatch_kl": float(((ratio - d - 1.0) * weights).sum()),
               "tis_capped_share": float(((ratio > cap).float() * weights).sum()) if cap > 0 else 0.0,
               "tis_applied": float(cap > 0)}
    return (ratio.clamp(max=cap) if cap > 0 else None), metrics
