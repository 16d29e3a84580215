"""`TrainerConfig`: every knob of the GRPO-family trainer, one documented field each.

    TrainerConfig(lr=6e-5, clip_high=0.28, kl_beta=0.0, loss_agg="token")
    TrainerConfig.from_dict(json.load(f), where="run.json:trainer")   # unknown keys are errors

A pydantic dataclass (`posttrain.settings`): types are checked, unknown fields rejected, and each
rule below names its field. It is also the `[trainer]` section of a run config as it stands.

The defaults are the recipe measured on the shipped tiny model (see `models/README.md`); a
larger model wants a smaller `lr`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import model_validator

from posttrain.settings import check, from_data, settings, to_data

LossAgg = Literal["token", "sequence"]
OldLogprobs = Literal["sampler", "recompute"]
Precision = Literal["fp32", "bf16"]


@settings
class LoraSettings:
    """LoRA adapters (`posttrain.training.engines.lora`; needs `pip install 'posttrain[lora]'`)."""

    r: int = 8
    """rank of each adapter (B @ A with B: out x r, A: r x in)"""
    alpha: float = 16.0
    """the adapters' update is scaled by alpha / r"""
    target_modules: str | list[str] = "all-linear"
    """module names to adapt (e.g. ["q_proj", "v_proj"]; GPT-2: ["c_attn"]), or "all-linear" """
    dropout: float = 0.0
    """dropout on the adapters' input (0: the update is deterministic)"""

    @model_validator(mode="after")
    def _rules(self) -> LoraSettings:
        check(self.r >= 1, self, "r", "must be an integer >= 1")
        check(self.alpha > 0, self, "alpha", "must be > 0")
        check(0 <= self.dropout < 1, self, "dropout", "must be in [0, 1)")
        check(bool(self.target_modules), self, "target_modules", "must name at least one module")
        return self


@settings
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
    micro_batch_tokens: int | Literal["auto"] = "auto"
    """a micro-batch also holds at most this many padded tokens (rows x its longest row, prompt +
    completion; a longer sample goes alone): memory bounded by tokens rather than sequences, which
    is what long answers need. 'auto' derives it each step from the model's shape, the step's
    longest sample and `micro_batch_memory_mb` (`posttrain.policies.memory`); 0 sets no token
    bound. Like `micro_batch_size`, it changes memory use, not the result"""
    micro_batch_memory_mb: float = 0.0
    """the memory one training micro-batch may use when `micro_batch_tokens` is 'auto'; 0: half
    the GPU's free memory, or a quarter of the machine's memory on the CPU"""
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
    replay_solved: int = 0
    """keep solved domains solved: each step replays up to this many kept all-pass groups (the
    newest per domain, the domains least recently replayed first) with advantage
    `replay_advantage`, their ratio taken against the log-probs the sampler recorded for them --
    so the term pulls back where the policy has moved probability away from a success and stops
    at the clip above it (`posttrain.training.replay`). Why: a domain the base model solves
    gives GRPO no gradient, adaptive sampling floors it, and its neighbours' updates can undo
    it unopposed. 0: off"""
    replay_advantage: float = 1.0
    """the advantage a replayed success carries (a group with a reward spread has advantages of
    about +-1 under `scale_by_std`)"""
    collapse_penalty: float = 0.0
    """push down a wrong answer the policy has settled on: in a group where every sample failed,
    the samples that gave the group's commonest answer (the same text, turn for turn), where at
    least `collapse_share` of the group gave it, carry advantage -collapse_penalty, against the
    sampler's log-probs under the clip below (`posttrain.training.advantages`). Why: a constant
    answer learned where it pays is carried to prompts that look alike, where it fails in every
    sample -- a group without a reward spread, which GRPO cannot see. Like a replayed group, such
    a sample weighs as one trajectory of the step without diluting the others. 0: off"""
    collapse_share: float = 0.5
    """the share of an all-fail group one answer must hold to count as collapsed (`collapse_penalty`)"""
    kl_anchor_domains: int = 0
    """extend the KL term to domains the step does not sample: keep the first `kl_anchor_samples`
    trainable samples of every domain and add those of up to this many domains to each step (the
    least recently anchored first) with advantage 0, so only `kl_beta`'s term acts on them, each
    sample weighing as one trajectory of the step without diluting the others
    (`posttrain.training.replay.KlAnchor`). Why: over hundreds of domains a step holds a few, and
    the others' answers drift unopposed while the shared weights move. Needs `kl_beta` > 0. 0: off"""
    kl_anchor_samples: int = 2
    """samples kept per domain for `kl_anchor_domains`"""
    kl_anchor_weight: float = 1.0
    """how much an anchored sample's KL term weighs against one of the step's own trajectories
    (`kl_anchor_domains`): it multiplies that sample's token weights, so `kl_beta` on the step's
    own samples stays as it is. Why: the pull back on the domains a step does not sample can be
    raised without adding anchored samples (each of those costs forwards and backwards) and
    without holding the learning domains' own tokens tighter"""
    min_group_size: int = 2
    """groups with fewer trainable trajectories (after dropping infra_error) are skipped, counted"""
    old_logprobs: OldLogprobs = "sampler"
    """where the ratio's denominator comes from: the sampler's recorded log-probs (cheaper;
    falls back to recompute for a turn that has none), or a no-grad pass before the update"""
    tis_cap: float = 0.0
    """truncated importance sampling (off-policy correction; 0 = off). When > 0 and the
    trajectories carry the sampler's log-probs, the trainer recomputes the log-probs with its own
    weights, uses them as the ratio's denominator, and weighs each token's policy-gradient term
    by min(exp(trainer - sampler), tis_cap): the sampler (an inference server, a stale copy) is
    the behaviour policy. Logged per step: `mismatch_abs_logp` (mean |trainer - sampler|),
    `mismatch_kl` (k3 estimate of KL(sampler || trainer)) and `tis_capped_share`"""
    temperature: float = 1.0
    """temperature the log-probs are computed at; must match the sampling temperature of the
    trajectories (checked against their recorded sampling settings)"""
    run_name: str = "run"
    """versions produced are named '<run_name>/step-<n>'"""
    seed: int = 0
    """seeds python, numpy and torch when the trainer is created (not on resume)"""
    engine: str = "local"
    """where the update runs: 'local' (this process) or 'fsdp' (FSDP2 `fully_shard`, one
    process per device under `torchrun`; `posttrain.training.engines.fsdp`)"""
    device: str = "cpu"
    """torch device of the model being trained ('cpu', 'cuda', 'cuda:1'); under torchrun with
    'cuda', each process uses the GPU of its local rank"""
    precision: Precision = "fp32"
    """'bf16': forward passes under `torch.autocast(dtype=bfloat16)` (weights, gradients and
    AdamW state stay float32; log-probs are taken in float32). Meant for GPUs, where it halves
    activation memory and runs on tensor cores; on a CPU it runs but is rarely faster"""
    lora: LoraSettings | None = None
    """train LoRA adapters instead of the weights, e.g. {r = 8, alpha = 16, target_modules =
    ["c_attn"]}: only adapter parameters get gradients and optimizer state, checkpoints hold the
    adapters and the base model's path, samplers get the merged weights. `local` engine only"""
    gradient_checkpointing: bool = False
    """recompute each decoder block's activations in the backward pass instead of keeping them
    (Hugging Face `gradient_checkpointing_enable`): activation memory of one block instead of
    all, for about one more forward of compute; the same loss and gradients"""

    @model_validator(mode="after")
    def _rules(self) -> TrainerConfig:
        check(self.lr > 0, self, "lr", "must be > 0")
        check(self.weight_decay >= 0, self, "weight_decay", "must be >= 0")
        check(len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas), self, "betas",
              "must be two numbers in [0, 1)")
        check(self.max_grad_norm >= 0, self, "max_grad_norm", "must be >= 0")
        check(self.micro_batch_tokens == "auto" or self.micro_batch_tokens >= 0, self, "micro_batch_tokens",
              "must be 'auto' or an integer >= 0 (0: no token bound)")
        check(self.micro_batch_memory_mb >= 0, self, "micro_batch_memory_mb", "must be >= 0 (0: from the device)")
        for name in ("micro_batch_size", "ppo_epochs"):
            check(getattr(self, name) >= 1, self, name, "must be an integer >= 1")
        check(0 <= self.clip_low < 1, self, "clip_low", "must be in [0, 1)")
        check(self.clip_high >= 0, self, "clip_high", "must be >= 0")
        check(self.kl_beta >= 0, self, "kl_beta", "must be >= 0")
        check(self.replay_solved >= 0, self, "replay_solved", "must be >= 0 (0: off)")
        check(self.replay_advantage > 0, self, "replay_advantage", "must be > 0")
        check(self.collapse_penalty >= 0, self, "collapse_penalty", "must be >= 0 (0: off)")
        check(0 < self.collapse_share <= 1, self, "collapse_share", "must be in (0, 1]")
        check(self.kl_anchor_domains >= 0, self, "kl_anchor_domains", "must be >= 0 (0: off)")
        check(self.kl_anchor_samples >= 1, self, "kl_anchor_samples", "must be an integer >= 1")
        check(self.kl_anchor_weight > 0, self, "kl_anchor_weight", "must be > 0")
        check(self.kl_anchor_domains == 0 or self.kl_beta > 0, self, "kl_anchor_domains",
              "needs kl_beta > 0 (the anchor is the KL term on the kept samples)")
        check(self.adv_eps > 0, self, "adv_eps", "must be > 0")
        check(self.tis_cap == 0 or self.tis_cap >= 1, self, "tis_cap", "must be 0 (off) or >= 1")
        check(self.engine in ("local", "fsdp"), self, "engine", "must be 'local' or 'fsdp'")
        check(self.lora is None or self.engine == "local", self, "lora",
              "is built for the 'local' engine only (LoRA under fsdp is not built yet)")
        check(self.min_group_size >= 2, self, "min_group_size",
              "must be an integer >= 2 (advantages are group-relative)")
        check(self.temperature > 0, self, "temperature",
              "must be > 0 (RL samples; greedy decoding has no log-probs to train)")
        check(bool(self.run_name) and "/" not in self.run_name, self, "run_name",
              "must be a non-empty name without '/'")
        return self

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "TrainerConfig") -> TrainerConfig:
        """Build from plain data (a JSON/TOML table); `where` names the source in errors."""
        return from_data(cls, data, where)

    def to_dict(self) -> dict[str, Any]:
        return to_data(self)
