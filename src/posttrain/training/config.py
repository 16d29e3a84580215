"""`TrainerConfig`: every knob of the GRPO-family trainer, one documented field each.

    TrainerConfig(lr=6e-5, clip_high=0.28, kl_beta=0.0, loss_agg="token")
    TrainerConfig.from_dict(json.load(f), where="run.json:trainer")   # unknown keys are errors

The defaults are the recipe measured on the shipped tiny model (see `models/README.md`); a
larger model wants a smaller `lr`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

LossAgg = Literal["token", "sequence"]
OldLogprobs = Literal["sampler", "recompute"]


@dataclass(frozen=True)
class TrainerConfig:
    lr: float = 1e-4
    """AdamW learning rate (constant)"""
    weight_decay: float = 0.0
    """AdamW weight decay"""
    betas: tuple[float, float] = (0.9, 0.99)
    """AdamW betas"""
    max_grad_norm: float = 1.0
    """global gradient-norm clip applied before every optimizer update (0 disables clipping;
    the norm is still measured and reported as `grad_norm`)"""
    micro_batch_size: int = 64
    """sequences per forward/backward; the gradients of a step's micro-batches are accumulated
    into one update, so this changes memory use, not the result"""
    ppo_epochs: int = 1
    """optimizer updates per `step()` over the same batch; 1 is strictly on-policy (the
    ratio is 1 up to sampler/trainer numerics), more reuse the samples and make clipping bite"""
    clip_low: float = 0.2
    """PPO clip: the ratio is clipped below at 1 - clip_low"""
    clip_high: float = 0.28
    """PPO clip above, at 1 + clip_high; larger than clip_low ("clip-higher", DAPO) leaves room
    to raise unlikely tokens that turned out right"""
    kl_beta: float = 0.0
    """weight of the per-token KL penalty to the reference (the starting weights), k3 estimator
    exp(ref - new) - (ref - new) - 1; 0 loads no reference model"""
    scale_by_std: bool = True
    """divide group-centred rewards by the group's standard deviation (GRPO); False keeps
    mean-centred rewards only (Dr. GRPO)"""
    adv_eps: float = 1e-4
    """added to the group standard deviation before dividing"""
    loss_agg: LossAgg = "token"
    """'token': every generated token of the batch weighs the same (DAPO); 'sequence': each
    trajectory's tokens are averaged first, then trajectories (original GRPO)"""
    filter_zero_variance: bool = True
    """drop groups whose rewards are all equal (no learning signal; always counted)"""
    min_group_size: int = 2
    """groups with fewer trainable trajectories (after dropping infra_error) are skipped, counted"""
    old_logprobs: OldLogprobs = "sampler"
    """where the ratio's denominator comes from: the sampler's recorded log-probs (cheaper;
    falls back to recompute for a turn that has none), or a no-grad pass before the update"""
    temperature: float = 1.0
    """temperature the log-probs are computed at; must match the sampling temperature of the
    trajectories (checked against their recorded sampling settings)"""
    run_name: str = "run"
    """versions produced are named '<run_name>/step-<n>'"""
    seed: int = 0
    """seeds python, numpy and torch when the trainer is created (not on resume)"""
    device: str = "cpu"
    """torch device of the model being trained ('cpu', 'cuda', 'cuda:1')"""

    def __post_init__(self) -> None:
        def bad(name: str, rule: str) -> ValueError:
            return ValueError(f"TrainerConfig.{name} {rule}, got {getattr(self, name)!r}")

        if not self.lr > 0:
            raise bad("lr", "must be > 0")
        if self.weight_decay < 0:
            raise bad("weight_decay", "must be >= 0")
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise bad("betas", "must be two numbers in [0, 1)")
        if self.max_grad_norm < 0:
            raise bad("max_grad_norm", "must be >= 0")
        for name in ("micro_batch_size", "ppo_epochs"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise bad(name, "must be an integer >= 1")
        if not 0 <= self.clip_low < 1:
            raise bad("clip_low", "must be in [0, 1)")
        if self.clip_high < 0:
            raise bad("clip_high", "must be >= 0")
        if self.kl_beta < 0:
            raise bad("kl_beta", "must be >= 0")
        if not self.adv_eps > 0:
            raise bad("adv_eps", "must be > 0")
        if self.loss_agg not in ("token", "sequence"):
            raise bad("loss_agg", "must be 'token' or 'sequence'")
        if self.old_logprobs not in ("sampler", "recompute"):
            raise bad("old_logprobs", "must be 'sampler' or 'recompute'")
        if not isinstance(self.min_group_size, int) or self.min_group_size < 2:
            raise bad("min_group_size", "must be an integer >= 2 (advantages are group-relative)")
        if not self.temperature > 0:
            raise bad("temperature", "must be > 0 (RL samples; greedy decoding has no log-probs to train)")
        if not self.run_name or "/" in self.run_name:
            raise bad("run_name", "must be a non-empty name without '/'")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "TrainerConfig") -> TrainerConfig:
        """Build from plain data (a JSON/TOML table); `where` names the source in errors."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"{where}: unknown TrainerConfig field(s) {', '.join(unknown)} "
                             f"(known: {', '.join(sorted(known))})")
        values = dict(data)
        if "betas" in values:
            values["betas"] = tuple(values["betas"])
        try:
            return cls(**values)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{where}: {e}") from e

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["betas"] = list(self.betas)
        return d
