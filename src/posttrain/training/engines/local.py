"""The single-process engine: the whole model and its optimizer in this process (CPU or one GPU)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from posttrain.training.batch import sequence_logprobs
from posttrain.training.engines.base import checkpointing, precision, prepare, sample_tokens, skip_nonfinite, split


class LocalEngine:
    rank, world = 0, 1

    def __init__(self, model: torch.nn.Module, config: Any, reference: torch.nn.Module | None = None) -> None:
        self.precision = getattr(config, "precision", "fp32")
        self.share_prompts = not checkpointing(config)
        self.lora = getattr(config, "lora", None) is not None
        self.full_model = model
        """the module whose full weights are in this process: the trained one itself, or with
        LoRA a plain copy that `refresh` keeps at base + adapters"""
        if self.lora:
            from posttrain.training.engines import lora

            model = lora.wrap(model, config.lora)
        self.model = prepare(model, config)
        self.reference = reference
        self.optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=config.lr,
                                           betas=config.betas, weight_decay=config.weight_decay)

    def micro_batches(self, lengths: Sequence[int], size: int, tokens: int = 0) -> list[tuple[int, int]]:
        return split(lengths, 0, len(lengths), size, tokens)

    def forward(self, samples: Sequence[Any], *, temperature: float,
                with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        with precision(self.model, self.precision):
            return sequence_logprobs(self.model, samples, temperature=temperature, with_entropy=with_entropy,
                                     share_prompts=self.share_prompts)

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def reduce(self, sums: dict[str, float], how: str = "sum") -> dict[str, float]:
        return dict(sums)

    def optimizer_step(self, max_grad_norm: float) -> float:
        limit = max_grad_norm if max_grad_norm > 0 else float("inf")
        norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), limit))
        if skip_nonfinite(norm, self.optimizer):
            return norm
        self.optimizer.step()
        return norm

    @torch.no_grad()
    def logprobs(self, model: torch.nn.Module, samples: Sequence[Any], *, temperature: float,
                 size: int, tokens: int = 0) -> torch.Tensor:
        was_training = model.training
        model.eval()
        try:
            with precision(model, self.precision):
                parts = [sequence_logprobs(model, samples[lo:hi], temperature=temperature)[0]
                         for lo, hi in self.micro_batches(sample_tokens(samples), size, tokens)]
        finally:
            model.train(was_training)
        return torch.cat(parts)

    def export_weights(self) -> dict[str, torch.Tensor]:
        from posttrain.policies.server.weights import untied_state_dict

        return untied_state_dict(self.full_model)

    def refresh(self) -> None:
        """With LoRA, merge the adapters into `full_model`; otherwise it is the trained module."""
        if self.lora:
            from posttrain.training.engines import lora

            with torch.no_grad():
                self.full_model.load_state_dict(lora.merged_state(self.model))

    def reference_weights(self) -> dict[str, torch.Tensor]:
        return {} if self.reference is None else dict(self.reference.state_dict())

    def optimizer_state(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def load_optimizer_state(self, state: dict[str, Any]) -> None:
        if any(isinstance(k, str) for k in state.get("state", {})):
            raise ValueError("the checkpoint's optimizer state is the fsdp engine's (parameters by "
                             "name): resume it with [trainer] engine = 'fsdp' under torchrun")
        self.optimizer.load_state_dict(state)
