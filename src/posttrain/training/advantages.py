"""Group-relative advantages, and choosing which groups a step can learn from.

GRPO scores each trajectory against the others sampled for the same task:
A_i = (r_i - mean(r)) / (std(r) + eps), with `std` the sample standard deviation (n - 1, as
TRL computes it), or A_i = r_i - mean(r) without the scaling. The advantage is shared by every
token of the trajectory.

A group is skipped -- and counted, never silently -- when
* after dropping its `infra_error` trajectories (never trained on: they have no reward) fewer
  than `min_group_size` remain, or
* all its rewards are equal (zero variance: every advantage is 0, nothing to learn).

One exception, off by default (`collapse_penalty`): a group in which every sample failed and at
least `collapse_share` of them gave the same answer (`collapsed_answer`). GRPO cannot see it -- no
reward spread -- yet it is the footprint of a constant answer the policy learned where it paid and
carries to prompts that look alike (a breadth run's `rg.self_reference`: "4" in most samples,
learned on other rg domains, 0.09 -> 0.0 pass@1). Those samples are returned apart
(`Selection.penalized`) to be pushed down with advantage -collapse_penalty; failures that
disagree are left alone, so a domain the model cannot do yet is not pushed anywhere.
"""

from __future__ import annotations

import math
from collections import Counter
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


def answer_of(t: Trajectory) -> tuple[str, ...]:
    """What a trajectory answered: its turns' actions, stripped (one string for a one-turn answer)."""
    return tuple(turn.action.strip() for turn in t.turns)


def collapsed_answer(group: Sequence[Trajectory], share: float) -> list[Trajectory]:
    """The samples of a group in which every sample failed that gave its commonest answer, if at
    least `share` of the group (and two samples) gave it; else none."""
    if not group or any(t.passed for t in group):
        return []
    counts = Counter(answer_of(t) for t in group)
    answer, n = counts.most_common(1)[0]
    if n < 2 or n < share * len(group):
        return []
    return [t for t in group if answer_of(t) == answer]


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
    penalized: list[Trajectory] = field(default_factory=list)
    """the samples of all-fail groups that gave a collapsed answer (`collapse_penalty`), not in
    `trajectories`: the trainer adds them with advantage -collapse_penalty"""
    groups_collapsed: int = 0


def select_groups(groups: Sequence[Sequence[Trajectory]], *, scale_by_std: bool = True,
                  eps: float = 1e-4, filter_zero_variance: bool = True,
                  min_group_size: int = 2, collapse_penalty: float = 0.0,
                  collapse_share: float = 0.5) -> Selection:
    """Drop infra errors, skip unusable groups, attach advantages to the rest; with
    `collapse_penalty`, set apart the collapsed answers of all-fail groups (module docstring)."""
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
            collapsed = collapsed_answer(ok, collapse_share) if collapse_penalty > 0 else []
            if collapsed:
                sel.groups_collapsed += 1
                sel.penalized.extend(collapsed)
            if filter_zero_variance:
                continue
            rest = [t for t in ok if all(t is not c for c in collapsed)]  # each sample once
            if rest:
                sel.groups_used += 1
                sel.trajectories.extend(rest)
                sel.advantages.extend([0.0] * len(rest))  # a zero-variance group's advantages
            continue
        sel.groups_used += 1
        sel.trajectories.extend(ok)
        sel.advantages.extend(group_advantages(rewards, scale_by_std=scale_by_std, eps=eps))
    return sel
