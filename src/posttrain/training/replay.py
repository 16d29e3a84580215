"""Keep solved domains solved, and every domain near the reference: kept samples in later steps.

A group whose samples all passed gives GRPO nothing (every advantage is 0) and adaptive sampling
then lowers the domain's weight: in a run over hundreds of domains a domain the base model
already solves is sampled a handful of times, and nothing in the loss holds it while the updates
of its neighbours move the tokens it shares with them. (Measured: in a 20-step breadth run
`terminal.files.concat` fell from 0.96 to 0.52 pass@1 after 2 groups of its own; its shell
command degenerated into a loop.) The KL term holds the policy to the reference only on the
tokens a step samples, which for such a domain is almost never.

`SolvedReplay` keeps, per domain, the newest group in which every sample passed, and each step
adds up to `TrainerConfig.replay_solved` of those groups (the domains least recently replayed
first, ties by name: deterministic, so every rank of a distributed trainer draws the same) to
the loss with advantage `replay_advantage` under the clipped objective, against the log-probs
*the sampler recorded when it produced them*. That makes it a one-sided trust region, not
imitation: while the policy gives a kept success at least the probability it had when sampled,
a token's gradient is small (log-probs near 0 on a solved task) and it stops entirely once the
ratio passes 1 + clip_high; where the policy has moved probability away from it, the ratio falls
and the term pulls it back. Self-imitation (Oh et al., 2018) with the PPO clip as the bound.

Only groups whose every turn carries the sampler's log-probs are kept (what the replay's ratio is
taken against), and none that showed images (`shows_images`); a replayed trajectory weighs in the
loss as one trajectory of the step without diluting the others (`losses.token_weights`'
`extra`). The buffer is part of the trainer's checkpoint, so a resumed run replays exactly what
the uninterrupted one would have.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from posttrain.values.trajectory import Trajectory


def all_passed(group: Sequence[Trajectory]) -> bool:
    """Every sample trainable and passed (an infra error leaves the group out: not a success)."""
    return bool(group) and all(t.trainable and t.passed for t in group)


def has_sampler_logprobs(group: Sequence[Trajectory]) -> bool:
    return all(turn.logprobs is not None and len(turn.logprobs) == len(turn.token_ids or ())
               for t in group for turn in t.turns if turn.token_ids)


def shows_images(group: Sequence[Trajectory]) -> bool:
    """A group that showed images is not kept: the checkpoint holds trajectories without their
    image bytes (those live in the store), so a resumed run could not replay it."""
    return any(turn.observation_images for t in group for turn in t.turns)


class SolvedReplay:
    """domain -> its newest all-pass group, and when it was last replayed."""

    def __init__(self) -> None:
        self.groups: dict[str, list[Trajectory]] = {}
        self.kept_at: dict[str, int] = {}
        """domain -> the trainer step whose batch brought its kept group"""
        self.replayed_at: dict[str, int] = {}
        """domain -> the last step that replayed it (-1: never)"""

    def observe(self, groups: Sequence[Sequence[Trajectory]], step: int) -> int:
        """Keep the all-pass groups of this step's batch (the newest replaces a domain's older
        one); returns how many were kept."""
        kept = 0
        for group in groups:
            if not all_passed(group) or not has_sampler_logprobs(group) or shows_images(group):
                continue
            domain = group[0].domain
            self.groups[domain] = list(group)
            self.kept_at[domain] = step
            self.replayed_at.setdefault(domain, -1)
            kept += 1
        return kept

    def draw(self, n: int, step: int) -> list[list[Trajectory]]:
        """Up to `n` kept groups for this step: the domains replayed least recently first (ties by
        name). A domain this batch samples too is not left out: its new groups may all pass again
        (no gradient), and where they have a reward spread the replay only adds its bounded pull."""
        order = sorted(self.groups, key=lambda d: (self.replayed_at[d], d))
        chosen = order[:max(n, 0)]
        for d in chosen:
            self.replayed_at[d] = step
        return [self.groups[d] for d in chosen]

    def state_dict(self) -> dict[str, Any]:
        return {"groups": {d: [t.to_dict() for t in g] for d, g in self.groups.items()},
                "kept_at": dict(self.kept_at), "replayed_at": dict(self.replayed_at)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.groups = {d: [Trajectory.from_dict(t) for t in g] for d, g in state.get("groups", {}).items()}
        self.kept_at = {d: int(s) for d, s in state.get("kept_at", {}).items()}
        self.replayed_at = {d: int(s) for d, s in state.get("replayed_at", {}).items()}


class KlAnchor:
    """domain -> the first trainable samples seen of it, anchored to the reference in later steps
    (`TrainerConfig.kl_anchor_domains`).

    The KL term holds the policy to the reference only on the tokens a step samples: with ~330
    domains and 32 groups a step, a domain's own tokens are in the loss every ten steps or so,
    while every step's update moves the weights they share. (Measured on the breadth runs: a
    constant answer learned where it pays -- "1" -- rose by 0.2-0.5 in domains that never paid
    it.) Each step adds the kept samples of up to `kl_anchor_domains` domains (the least recently
    anchored first, ties by name: deterministic on every rank) with advantage 0, so the policy
    gradient is 0 on them and the KL term alone acts: where the policy has moved probability away
    from what the domain's early samples said, relative to the reference, it pulls back.

    The *first* samples of a domain are kept, not the newest: they come from the policy nearest
    the reference, so the anchor measures the drift from the base model's own answers (a KL from
    where the reference put its mass), which is what the newest, already drifted samples would
    not show. Samples that showed images are not kept (`shows_images`)."""

    def __init__(self, per_domain: int) -> None:
        self.per_domain = per_domain
        self.samples: dict[str, list[Trajectory]] = {}
        self.anchored_at: dict[str, int] = {}
        """domain -> the last step that anchored it (-1: never)"""

    def observe(self, groups: Sequence[Sequence[Trajectory]]) -> int:
        """Keep samples of the domains first seen in this step's batch; returns how many domains."""
        kept = 0
        for group in groups:
            if not group or shows_images(group):
                continue
            domain = group[0].domain
            if domain in self.samples:
                continue
            chosen = [t for t in group if t.trainable and any(turn.token_ids for turn in t.turns)]
            if chosen:
                self.samples[domain] = chosen[:self.per_domain]
                self.anchored_at[domain] = -1
                kept += 1
        return kept

    def draw(self, n: int, step: int) -> list[Trajectory]:
        """The kept samples of up to `n` domains, the least recently anchored first."""
        chosen = sorted(self.samples, key=lambda d: (self.anchored_at[d], d))[:max(n, 0)]
        for d in chosen:
            self.anchored_at[d] = step
        return [t for d in chosen for t in self.samples[d]]

    def state_dict(self) -> dict[str, Any]:
        return {"samples": {d: [t.to_dict() for t in ts] for d, ts in self.samples.items()},
                "anchored_at": dict(self.anchored_at)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.samples = {d: [Trajectory.from_dict(t) for t in ts] for d, ts in state.get("samples", {}).items()}
        self.anchored_at = {d: int(s) for d, s in state.get("anchored_at", {}).items()}
