"""Group-relative advantages, and choosing which groups a step can learn from.

GRPO scores each trajectory against the others sampled for the same task:
A_i = (r_i - mean(r)) / (std(r) + eps), with `std` the sample standard deviation (n - 1, as
TRL computes it), or A_i = r_i - mean(r) without the scaling. The advantage is shared by every
token of the trajectory.

A group is skipped -- and counted, never silently -- when
* after dropping its `infra_error` trajectories (never trained on: they have no reward) fewer
  than `min_group_size` remain, or
* all its rewards are equal (zero variance: every advantage is 0, nothing to learn).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from posttrain.values.trajectory import Trajectory


def group_advantages(rewards: Sequence[float], *, scale_by_std: bool = True,
                     eps: float = 1e-4) -> list[float]:
    """Advantages of one group's rewards (see the module docstring)."""
    n = len(rewards)
    if n < 2:
        raise ValueError(f"group_advantages needs at least 2 rewards, got {n}")
    mean = sum(rewards) / n
    centred = [r - mean for r in rewards]
    if not scale_by_std:
        return centred
    std = math.sqrt(sum(c * c for c in centred) / (n - 1))
    return [c / (std + eps) for c in centred]


def is_zero_variance(rewards: Sequence[float], tol: float = 1e-9) -> bool:
    return max(rewards) - min(rewards) <= tol


@dataclass
class Selection:
    """What a step trains on, and what it left out (with counts)."""

    trajectories: list[Trajectory] = field(default_factory=list)
    advantages: list[float] = field(default_factory=list)
    groups: int = 0
    groups_used: int = 0
    groups_zero_variance: int = 0
    groups_too_small: int = 0
    trajectories_in: int = 0
    infra_errors: int = 0
    truncated: int = 0
    """trainable trajectories whose episode a budget cut (trained on; counted)"""
    length_cut: int = 0
    """trainable trajectories with a turn cut by max_tokens (finish_reason 'length'): a budget
    that cuts most answers silently starves learning, so it is counted"""
    trainable: int = 0
    reward_sum: float = 0.0


def select_groups(groups: Sequence[Sequence[Trajectory]], *, scale_by_std: bool = True,
                  eps: float = 1e-4, filter_zero_variance: bool = True,
                  min_group_size: int = 2) -> Selection:
    """Drop infra errors, skip unusable groups, attach advantages to the rest."""
    sel = Selection(groups=len(groups))
    for group in groups:
        sel.trajectories_in += len(group)
        ok = [t for t in group if t.trainable]
        sel.infra_errors += len(group) - len(ok)
        sel.trainable += len(ok)
        sel.truncated += sum(t.status == "truncated" for t in ok)
        sel.length_cut += sum(any(turn.finish_reason == "length" for turn in t.turns) for t in ok)
        rewards = [float(t.reward) for t in ok]  # type: ignore[arg-type]
        sel.reward_sum += sum(rewards)
        if len(ok) < min_group_size:
            sel.groups_too_small += 1
            continue
        if is_zero_variance(rewards):
            sel.groups_zero_variance += 1
            if filter_zero_variance:
                continue
        sel.groups_used += 1
        sel.trajectories.extend(ok)
        sel.advantages.extend(group_advantages(rewards, scale_by_std=scale_by_std, eps=eps))
    return sel
