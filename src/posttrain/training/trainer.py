"""`Trainer`: groups of trajectories in, a new policy version out (GRPO family).

    trainer = Trainer("models/tiny-base", TrainerConfig(run_name="round-1"))   # or a VLM's directory
    for groups in batches:                       # list[list[Trajectory]], one list per task
        metrics = trainer.step(groups)
    trainer.save("runs/x/ckpt/step-40", extra={"scheduler": ...})
    trainer = Trainer.resume("runs/x/ckpt/step-40")      # continues exactly
    policy = trainer.policy()                    # current weights as a Policy, for sampling

One `step()`:
1. per group, drop `infra_error` trajectories (counted, never trained on), skip groups too
   small or with zero reward variance (counted), attach group-relative advantages
   (`advantages.py`);
2. one sample per generated turn (`batch.py`); old log-probs from the sampler or a no-grad pass,
   reference log-probs when `kl_beta > 0`;
3. `ppo_epochs` optimizer updates, each accumulating the clipped loss (`losses.py`) over
   micro-batches (bounded by sequences and by padded tokens: `token_bound`, from the memory
   estimate by default), then gradient clipping and AdamW.

Vision: built from a `VisionPolicy` (an image-text-to-text model and its processor; a model
directory whose config.json has a `vision_config` is loaded as one), a trainer
re-runs each trajectory's images through the processor and recomputes log-probs with them
(`batch.py`); checkpoints keep the processor, and `policy()` is a `VisionPolicy` again.

Lineage: a trainer starts from some version (the base model, or a checkpoint of an earlier
round); every version it produces is '<run_name>/step-<n>' with that starting version as its
parent, so base -> round-1/step-200 -> round-2/step-200 reads back through `parent`.
"""

from __future__ import annotations

import copy
import json
import math
import os
import random
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from posttrain.policies.local import VERSION_FILE, TorchPolicy, weights_hash
from posttrain.policies.memory import MemoryModel, default_cap_bytes
from posttrain.policies.vision import VisionPolicy, is_vision_model
from posttrain.training import checkpoints
from posttrain.training.advantages import select_groups
from posttrain.training.batch import Sample, samples_from
from posttrain.training.config import TrainerConfig
from posttrain.training.engines import make_engine, ranks
from posttrain.training.engines.base import sample_tokens
from posttrain.training.losses import clipped_pg_loss, off_policy, token_weights
from posttrain.training.replay import KlAnchor, SolvedReplay
from posttrain.values.generation import PolicyVersion
from posttrain.values.trajectory import Trajectory

_TOTALS = ("trajectories", "infra_errors", "groups", "groups_zero_variance", "groups_too_small",
           "tokens", "updates", "updates_nonfinite")

MAX_NONFINITE_STEPS = 3
"""steps in a row whose every update had an inf or nan gradient (each skipped, `skip_nonfinite`)
before the trainer stops: one bad batch is skipped, a run that no longer trains is an error"""


class NonFiniteUpdates(RuntimeError):
    """The gradients stayed inf or nan for `MAX_NONFINITE_STEPS` steps in a row: every update was
    skipped, so nothing was trained; the last checkpoint holds the last finite weights."""


class Trainer:
    def __init__(self, policy: str | os.PathLike | TorchPolicy | VisionPolicy,
                 config: TrainerConfig = TrainerConfig(), *, _seed: bool = True,
                 _reference: torch.nn.Module | None = None, _adapter: str | os.PathLike | None = None) -> None:
        self.config = config
        if _seed:
            random.seed(config.seed)
            np.random.seed(config.seed)
            torch.manual_seed(config.seed)
        if not isinstance(policy, (TorchPolicy, VisionPolicy)):  # a directory: its config says which
            policy = VisionPolicy.load(policy) if is_vision_model(policy) else TorchPolicy(policy, device=config.device)
        self.vision: VisionPolicy | None = policy if isinstance(policy, VisionPolicy) else None
        """set when training an image-text-to-text model: its processor makes the image inputs"""
        self.base_path = str(policy.path.resolve()) if policy.path is not None else None
        """where the starting weights were read (a LoRA checkpoint records it: it holds adapters only)"""
        model = policy.model.to(config.device)  # trained in place
        self.tokenizer = policy.tokenizer
        self.start_version: PolicyVersion = policy.version
        reference: torch.nn.Module | None = None
        if config.kl_beta > 0:  # a resumed run's reference is the checkpoint's, not these weights
            reference = (_reference if _reference is not None else copy.deepcopy(model))
            reference = reference.to(config.device).eval().requires_grad_(False)
        self.memory = MemoryModel.of(policy.model)
        """the model's shape, for the memory bound of a micro-batch (`token_bound`);
        read before a distributed engine shards it"""
        self.engine = make_engine(model, config, reference)
        """where forward/backward and the optimizer run (`posttrain.training.engines`)"""
        if _adapter is not None:  # a LoRA checkpoint's adapters, on top of the base
            from posttrain.training.engines import lora

            lora.load_adapter(self.engine.model, checkpoints.load_adapter(_adapter))
            self.engine.refresh()
        full = self.engine.full_model
        self.model: torch.nn.Module = full if full is not None else self.engine.model
        """the full current weights in this process: the trained module itself in one process;
        under FSDP, rank 0's unsharded copy, refreshed after every step (what samplers, versions
        and checkpoints read). The module the engine trains is `engine.model`"""
        self.reference = self.engine.reference
        self.optimizer = self.engine.optimizer
        self.followers = False
        """rank 0 of `posttrain run` under torchrun: `step` and `save` first tell the other
        ranks to make the same calls (`posttrain.training.engines.ranks`)"""
        self.step_count = 0
        self.data_cursor = 0
        """groups consumed so far; a caller drawing data in order resumes from here"""
        self.extra: dict[str, Any] = {}
        self.totals: dict[str, int] = {k: 0 for k in _TOTALS}
        self.replay = SolvedReplay()
        """the kept all-pass groups (`TrainerConfig.replay_solved`; checkpointed)"""
        self.anchor = KlAnchor(config.kl_anchor_samples)
        """every domain's first samples, held to the reference (`TrainerConfig.kl_anchor_domains`)"""
        self.nonfinite_streak = 0
        """steps in a row whose every update was skipped for a non-finite gradient (checkpointed)"""
        self._hash_cache: tuple[int, str] | None = None

    # -- versions --------------------------------------------------------------------
    @property
    def version(self) -> PolicyVersion:
        """The current weights' identity ('<run_name>/step-<n>', parent: the starting version)."""
        if self.step_count == 0:
            return self.start_version
        if self._hash_cache is None or self._hash_cache[0] != self.step_count:
            self._hash_cache = (self.step_count, weights_hash(self.model))
        return PolicyVersion(name=f"{self.config.run_name}/step-{self.step_count}",
                             parent=self.start_version.name, weights_hash=self._hash_cache[1],
                             tokenizer_hash=self.start_version.tokenizer_hash)

    def policy(self, **kwargs: Any) -> TorchPolicy:
        """The current weights as a Policy. It shares the trained module (no copy): take a new
        one after each step so that trajectories record the right version. A vision trainer's
        is `vision_policy()`."""
        if self.vision is not None:
            raise TypeError("this trainer trains an image-text-to-text model: take its policy with "
                            "vision_policy()")
        return TorchPolicy(self.model, self.tokenizer, version=self.version, **kwargs)

    def vision_policy(self) -> VisionPolicy:
        """`policy()` for a trainer built from a `VisionPolicy` (same sharing, same processor)."""
        if self.vision is None:
            raise TypeError("this trainer trains a text model: take its policy with policy()")
        return VisionPolicy(self.model, self.vision.processor, version=self.version,
                            image_token=self.vision.image_token)

    # -- one step --------------------------------------------------------------------
    def step(self, groups: Sequence[Sequence[Trajectory]]) -> dict[str, float]:
        """Learn from `groups` (one list of trajectories per task); returns the step's metrics."""
        cfg = self.config
        if self.followers:
            ranks.announce("step", [list(g) for g in groups])
        t0 = time.perf_counter()
        sel = select_groups(groups, scale_by_std=cfg.scale_by_std, eps=cfg.adv_eps,
                            filter_zero_variance=cfg.filter_zero_variance,
                            min_group_size=cfg.min_group_size, collapse_penalty=cfg.collapse_penalty,
                            collapse_share=cfg.collapse_share)
        drawn: list[list[Trajectory]] = []
        if cfg.replay_solved:  # drawn before this batch is kept: never replayed in its own step
            drawn = self.replay.draw(cfg.replay_solved, self.step_count)
            kept = self.replay.observe(groups, self.step_count)
        replayed = [t for g in drawn for t in g]
        anchored: list[Trajectory] = []
        if cfg.kl_anchor_domains:  # drawn before this batch is kept, like the replay
            anchored = self.anchor.draw(cfg.kl_anchor_domains, self.step_count)
            anchors_new = self.anchor.observe(groups)
        trajectories = sel.trajectories + sel.penalized + replayed + anchored
        self._check_temperature(trajectories)
        advantages = (sel.advantages + [-cfg.collapse_penalty] * len(sel.penalized)
                      + [cfg.replay_advantage] * len(replayed) + [0.0] * len(anchored))
        samples, skipped_turns = samples_from(trajectories, advantages,
                                              image_inputs=self.vision.image_inputs if self.vision else None)
        # none dilutes the step's policy gradient (`losses.token_weights`' extra)
        extra_owners = set(range(len(sel.trajectories), len(trajectories)))
        anchor_start = len(trajectories) - len(anchored)
        replay_owners = set(range(len(sel.trajectories) + len(sel.penalized), anchor_start))
        anchor_owners = set(range(anchor_start, len(trajectories)))
        n_tokens = sum(len(s.completion_ids) for s in samples)
        metrics: dict[str, float] = {
            "groups": sel.groups, "groups_used": sel.groups_used,
            "groups_zero_variance": sel.groups_zero_variance,
            "share_zero_variance": sel.groups_zero_variance / max(sel.groups, 1),
            "groups_too_small": sel.groups_too_small, "trajectories": sel.trajectories_in,
            "infra_errors": sel.infra_errors,
            "truncation_share": sel.truncated / max(sel.trainable, 1),
            "length_cut_share": sel.length_cut / max(sel.trainable, 1),
            "reward_mean": sel.reward_sum / max(sel.trainable, 1),
            "samples": len(samples), "tokens": n_tokens, "skipped_turns": skipped_turns,
        }
        if cfg.collapse_penalty:
            metrics.update(collapse_groups=sel.groups_collapsed, collapse_trajectories=len(sel.penalized))
        if cfg.replay_solved:
            metrics.update(replay_groups=len(drawn), replay_trajectories=len(replayed), replay_kept=kept,
                           replay_domains=len(self.replay.groups))
        if cfg.kl_anchor_domains:
            metrics.update(anchor_trajectories=len(anchored), anchor_new=anchors_new,
                           anchor_domains=len(self.anchor.samples))
        if n_tokens:
            metrics.update(self._update(samples, replay_owners, extra_owners, anchor_owners))
            self.engine.refresh()
        else:
            metrics.update({"loss": 0.0, "pg_loss": 0.0, "kl": 0.0, "clip_fraction": 0.0,
                            "grad_norm": 0.0, "entropy": 0.0, "updated": 0})
        nonfinite = int(metrics.get("grad_nonfinite", 0))
        if n_tokens:
            self._count_nonfinite(nonfinite)
        self.step_count += 1
        self.data_cursor += len(groups)
        for key, value in (("trajectories", sel.trajectories_in), ("infra_errors", sel.infra_errors),
                           ("groups", sel.groups), ("groups_zero_variance", sel.groups_zero_variance),
                           ("groups_too_small", sel.groups_too_small), ("tokens", n_tokens),
                           ("updates", int(metrics["updated"]) * cfg.ppo_epochs - nonfinite),
                           ("updates_nonfinite", nonfinite)):
            self.totals[key] += value
        metrics.update(step=self.step_count, lr=cfg.lr, step_s=time.perf_counter() - t0)
        return metrics

    def _count_nonfinite(self, skipped: int) -> None:
        """After a step's updates: `skipped` of them had an inf or nan gradient and were not
        applied (the engine's `skip_nonfinite`). A step with every update skipped extends the
        streak; `MAX_NONFINITE_STEPS` of them stop the run (`NonFiniteUpdates`)."""
        self.nonfinite_streak = self.nonfinite_streak + 1 if skipped >= self.config.ppo_epochs else 0
        if self.nonfinite_streak >= MAX_NONFINITE_STEPS:
            raise NonFiniteUpdates(
                f"step {self.step_count + 1}: the gradient was inf or nan in every update of the last "
                f"{self.nonfinite_streak} steps (all skipped, nothing trained); the loss or the model "
                f"is broken (check the learning rate, the precision, the rewards)")

    def _check_temperature(self, trajectories: Sequence[Trajectory]) -> None:
        for t in trajectories:
            sampled_at = t.sampling.get("temperature") if t.sampling else None
            if sampled_at is not None and abs(float(sampled_at) - self.config.temperature) > 1e-6:
                raise ValueError(
                    f"trajectory {t.id} ({t.task_key}) was sampled at temperature {sampled_at}, "
                    f"but TrainerConfig.temperature is {self.config.temperature}: the log-probs "
                    "would not describe the policy that sampled it")

    def _logprobs_no_grad(self, model: torch.nn.Module, samples: list[Sample], tokens: int) -> torch.Tensor:
        return self.engine.logprobs(model, samples, temperature=self.config.temperature,
                                    size=self.config.micro_batch_size, tokens=tokens)

    def token_bound(self, samples: Sequence[Sample]) -> int:
        """Padded tokens one micro-batch of `samples` may hold: `micro_batch_tokens`, or with
        'auto' what the memory estimate allows for the step's longest sample under the cap
        (`micro_batch_memory_mb`, else from the device), so long sequences split, never OOM."""
        cfg = self.config
        if cfg.micro_batch_tokens != "auto":
            return int(cfg.micro_batch_tokens)
        cap = (int(cfg.micro_batch_memory_mb * 2**20) if cfg.micro_batch_memory_mb > 0
               else default_cap_bytes(next(self.engine.model.parameters()).device))
        return self.memory.train_tokens(cap, max(sample_tokens(samples), default=1))

    def _update(self, samples: list[Sample], replay_owners: set[int], extra_owners: set[int],
                anchor_owners: set[int]) -> dict[str, float]:
        cfg = self.config
        engine = self.engine
        device = next(engine.model.parameters()).device
        offsets = [0]
        for s in samples:
            offsets.append(offsets[-1] + len(s.completion_ids))
        weights = torch.tensor([w for ws in token_weights([len(s.completion_ids) for s in samples],
                                                          [s.owner for s in samples], cfg.loss_agg, extra_owners)
                                for w in ws], device=device)
        adv = torch.tensor([s.advantage for s in samples for _ in s.completion_ids], device=device)
        has_sampler = all(s.old_logprobs for s in samples)
        behaviour = (torch.tensor([lp for s in samples for lp in s.old_logprobs or ()], device=device)
                     if has_sampler else None)
        tis = cfg.tis_cap > 0 and behaviour is not None
        use_sampler = cfg.old_logprobs == "sampler" and has_sampler and not tis
        tokens = self.token_bound(samples)
        old = behaviour if use_sampler else self._logprobs_no_grad(engine.model, samples, tokens)
        assert old is not None
        is_weights, mismatch = None, dict[str, float]()
        if behaviour is not None and not use_sampler:  # trainer vs sampler, token by token
            is_weights, mismatch = off_policy(old, behaviour, weights, cfg.tis_cap if tis else 0.0)
        ref = self._logprobs_no_grad(self.reference, samples, tokens) if self.reference is not None else None
        replay_w = None
        if replay_owners:  # a replayed success's ratio is against what its sampler recorded
            mask = _owned(samples, replay_owners, device)
            recorded = torch.tensor([lp for s in samples for lp in (
                s.old_logprobs if s.owner in replay_owners and s.old_logprobs else [0.0] * len(s.completion_ids))],
                device=device, dtype=old.dtype)
            old = torch.where(mask, recorded, old)
            if is_weights is not None:
                is_weights = torch.where(mask, torch.ones_like(is_weights), is_weights)
            replay_w = _share(weights, mask)
        anchor_w, loss_w = None, weights
        if anchor_owners:
            anchor_mask = _owned(samples, anchor_owners, device)
            # the KL on the anchored samples alone, per token (a metric)
            anchor_w = _share(weights, anchor_mask)
            # the loss's weights: an anchored sample's KL term scaled by `kl_anchor_weight` (its
            # policy-gradient term is 0 with advantage 0, so only the pull to the reference changes)
            loss_w = torch.where(anchor_mask, weights * cfg.kl_anchor_weight, weights)
        # the `kl` metric reads the step's own samples, so that it means the same with and without
        # replayed, penalized or anchored samples in the loss (a step of those alone: all of them)
        own_w = _share(weights, ~_owned(samples, extra_owners, device)) if extra_owners else weights
        if not float(own_w.sum()):
            own_w = weights

        engine.model.train()
        sums = {"loss": 0.0, "pg_loss": 0.0, "kl": 0.0, "clip_fraction": 0.0, "entropy": 0.0,
                "grad_norm": 0.0, "sampler_logprob_diff": 0.0, "replay_drift": 0.0, "anchor_kl": 0.0}
        ratio_max, skipped = 0.0, 0
        ranges = engine.micro_batches(sample_tokens(samples), cfg.micro_batch_size, tokens)
        for epoch in range(cfg.ppo_epochs):
            step_sums = dict.fromkeys(sums, 0.0)
            self.optimizer.zero_grad(set_to_none=True)
            for lo, hi in ranges:
                if lo == hi:  # a distributed engine's placeholder: same forwards on every rank
                    new, _ = engine.forward(samples[:1], temperature=cfg.temperature)
                    engine.backward(new.sum() * 0.0)
                    continue
                a, b = offsets[lo], offsets[hi]
                new, entropy = engine.forward(samples[lo:hi], temperature=cfg.temperature, with_entropy=True)
                parts = clipped_pg_loss(new, old[a:b], adv[a:b], loss_w[a:b],
                                        clip_low=cfg.clip_low, clip_high=cfg.clip_high,
                                        ref_logp=None if ref is None else ref[a:b], kl_beta=cfg.kl_beta,
                                        is_weights=None if is_weights is None else is_weights[a:b])
                engine.backward(parts.loss)
                step_sums["loss"] += float(parts.loss.detach())
                step_sums["pg_loss"] += parts.pg
                if parts.kl_tokens is not None:
                    step_sums["kl"] += float((parts.kl_tokens * own_w[a:b]).sum())
                step_sums["clip_fraction"] += parts.clip_fraction
                ratio_max = max(ratio_max, parts.ratio_max)
                assert entropy is not None
                step_sums["entropy"] += float((entropy * weights[a:b]).sum())
                if epoch == 0 and anchor_w is not None and parts.kl_tokens is not None:
                    step_sums["anchor_kl"] += float((parts.kl_tokens * anchor_w[a:b]).sum())
                if epoch == 0 and replay_w is not None:  # how far the kept successes have slipped
                    step_sums["replay_drift"] += float(((old[a:b] - new.detach()) * replay_w[a:b]).sum())
                if epoch == 0:
                    step_sums["sampler_logprob_diff"] += float(((new.detach() - old[a:b]).abs()
                                                                * weights[a:b]).sum())
            step_sums = engine.reduce(step_sums)  # sums over ranks (a no-op in one process)
            norm = engine.optimizer_step(cfg.max_grad_norm)  # not applied when inf or nan
            finite = math.isfinite(norm)
            skipped += not finite
            step_sums["grad_norm"] = norm if finite else 0.0
            for k, v in step_sums.items():
                sums[k] += v
        sums["ratio_max"] = engine.reduce({"ratio_max": ratio_max}, how="max")["ratio_max"]
        out = {k: (v if k == "ratio_max" else v / cfg.ppo_epochs) for k, v in sums.items()}
        out["grad_norm"] = sums["grad_norm"] / max(cfg.ppo_epochs - skipped, 1)  # of the applied updates
        out["grad_nonfinite"] = float(skipped)
        out["sampler_logprob_diff"] = sums["sampler_logprob_diff"] if use_sampler else 0.0
        out.pop("replay_drift")
        if replay_w is not None:
            out["replay_drift"] = sums["replay_drift"]  # summed over epoch 0 only, like the line above
        out.pop("anchor_kl")
        if anchor_w is not None:
            out["anchor_kl"] = sums["anchor_kl"]  # before the step's updates (epoch 0)
        out["old_logprobs_from_sampler"] = float(use_sampler)
        out.update(mismatch)
        out["updated"] = 1
        # how the memory bound cut the batch (this rank's forwards per update)
        out["micro_batches"] = float(len(ranges))
        out["micro_batch_tokens"] = float(tokens)
        return out

    # -- checkpoints -----------------------------------------------------------------
    def save(self, directory: str | os.PathLike, extra: dict[str, Any] | None = None) -> Path:
        """Write an atomic checkpoint (see `checkpoints.py`); `extra` replaces `self.extra`.
        Under FSDP every rank calls it (the state is gathered) and rank 0 alone writes."""
        if self.followers:
            ranks.announce("save", str(directory))
        optimizer_state = self.engine.optimizer_state()
        reference = self.engine.reference_weights()
        if self.engine.rank != 0:
            return Path(directory)
        if extra is not None:
            self.extra = dict(extra)
        version = self.version
        state = {"step": self.step_count, "data_cursor": self.data_cursor,
                 "config": self.config.to_dict(), "version": version.to_dict(),
                 "start_version": self.start_version.to_dict(), "totals": dict(self.totals),
                 "extra": self.extra, "vision": self.vision is not None,
                 "replay": self.replay.state_dict(), "anchor": self.anchor.state_dict(),
                 "nonfinite_streak": self.nonfinite_streak}
        lora = self.config.lora is not None
        if lora:
            if self.base_path is None:
                raise ValueError("a LoRA checkpoint records the base model's directory: build the "
                                 "Trainer from a path (or a TorchPolicy loaded from one)")
            state["lora_base"] = self.base_path

        def write(tmp: Path) -> None:
            if lora:  # the adapters alone (peft's format); the base is read from `lora_base`
                self.engine.model.save_pretrained(tmp)
            else:
                self.model.save_pretrained(tmp)  # type: ignore[operator]  # nn.Module does not declare Hugging Face methods
            # a vision model's processor holds its tokenizer and its image settings
            (self.vision.processor if self.vision is not None else self.tokenizer).save_pretrained(tmp)
            lineage = {"name": version.name, "parent": version.parent}
            (tmp / VERSION_FILE).write_text(json.dumps(lineage) + "\n")
            if self.reference is not None and not lora:  # with LoRA the reference is the base
                self.model.save_pretrained(tmp / "reference", state_dict=reference)  # type: ignore[operator]
            checkpoints.save_state(tmp, optimizer=optimizer_state, state=state)

        return checkpoints.write_atomic(directory, write)

    @classmethod
    def resume(cls, directory: str | os.PathLike, config: TrainerConfig | None = None) -> Trainer:
        """Continue a run from its checkpoint: weights, optimizer, RNG, step, cursor, extra.

        `config` defaults to the checkpoint's own; pass one only to change what does not alter
        the optimisation (device, micro_batch_size), or knowingly."""
        state = checkpoints.load_state(directory)
        if config is None:
            config = TrainerConfig.from_dict(state["config"], where=f"{directory}/trainer_state.json")
        start = PolicyVersion(**state["start_version"])
        base = state.get("lora_base")
        policy: TorchPolicy | VisionPolicy
        if state.get("vision"):
            if base is not None:
                raise ValueError(f"{directory}: LoRA checkpoints of vision models are not supported")
            policy = VisionPolicy.load(directory, version=start)
            policy.model.to(config.device)
        else:
            policy = TorchPolicy(base or directory, device=config.device, version=start)
        reference = None
        if config.kl_beta > 0 and base is None:  # loaded before the engine shards it
            from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

            auto = AutoModelForImageTextToText if state.get("vision") else AutoModelForCausalLM
            reference = auto.from_pretrained(Path(directory) / "reference")
        trainer = cls(policy, config, _seed=False, _reference=reference,
                      _adapter=directory if base is not None else None)
        trainer.engine.load_optimizer_state(checkpoints.load_tensors(directory, "optimizer.pt"))
        trainer.step_count = int(state["step"])
        trainer.data_cursor = int(state["data_cursor"])
        trainer.totals.update(state.get("totals", {}))
        trainer.extra = dict(state.get("extra") or {})
        trainer.replay.load_state_dict(state.get("replay") or {})
        trainer.anchor.load_state_dict(state.get("anchor") or {})
        trainer.nonfinite_streak = int(state.get("nonfinite_streak", 0))
        checkpoints.set_rng_state(checkpoints.load_tensors(directory, "rng.pt"))
        return trainer


def _owned(samples: Sequence[Sample], owners: set[int], device: torch.device) -> torch.Tensor:
    """Per generated token of `samples`: whether its trajectory is one of `owners`."""
    return torch.tensor([s.owner in owners for s in samples for _ in s.completion_ids], device=device,
                        dtype=torch.bool)


def _share(weights: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`weights` on the masked tokens, renormalised to sum to 1 (all zero where none is masked)."""
    masked = weights * mask
    return masked / masked.sum().clamp_min(1e-12)
