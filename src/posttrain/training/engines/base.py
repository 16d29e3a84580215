"""The trainer engine contract: the few calls every backend answers (verl's BaseEngine and
Tinker's API share them), so `Trainer` holds the RL logic once and a backend only moves tensors.

    engine = make_engine(model, config)
    for lo, hi in engine.micro_batches(lengths, config.micro_batch_size, tokens):  # this rank's share
        new, entropy = engine.forward(samples[lo:hi])         # differentiable log-probs
        engine.backward(loss)                                 # this micro-batch's share of the loss
    sums = engine.reduce(sums)                                # metrics summed over ranks
    grad_norm = engine.optimizer_step(max_grad_norm)          # clip, step (grads kept until zeroed;
                                                              # a non-finite norm: no step, see skip_nonfinite)
    engine.logprobs(model, samples)                           # no-grad log-probs, every token, every rank
    engine.refresh()                                          # `full_model` takes the update (rank 0)
    engine.export_weights()                                   # full, untied state dict (rank 0)
    engine.optimizer_state(); engine.load_optimizer_state(s)  # checkpoints (every rank calls both)

Under a distributed backend every call above is a collective: every rank makes it, in the same
order (`posttrain.training.engines.ranks` has rank 0 tell the others what to call).

A backend is accepted when its first steps' losses and gradient norms match the `local`
backend's on the same batches (`benchmarks/engines.py`: `fsdp_loss_rel_diff`).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence
from typing import Any, Protocol

import torch

ENGINES = ("local", "fsdp")


def skip_nonfinite(norm: float, optimizer: torch.optim.Optimizer) -> bool:
    """True (and the gradients dropped) when the step's gradient norm is inf or nan: stepping
    would write nan into every weight the optimizer touches (AdamW's moments included), and no
    later step recovers from that. The update is skipped instead, as verl's actor does; the
    trainer counts it (`grad_nonfinite`) and stops a run whose updates keep being skipped."""
    if math.isfinite(norm):
        return False
    optimizer.zero_grad(set_to_none=True)
    return True


class TrainEngine(Protocol):
    model: torch.nn.Module
    """the trained module (sharded by a distributed backend)"""
    full_model: torch.nn.Module | None
    """the unsharded weights in this process (the trained module itself in one process; rank 0's
    copy, refreshed after each update, under a distributed backend; None on other ranks)"""
    reference: torch.nn.Module | None
    optimizer: torch.optim.Optimizer
    rank: int
    world: int

    def micro_batches(self, lengths: Sequence[int], size: int, tokens: int = 0) -> list[tuple[int, int]]:
        """The sample ranges this rank computes (`split` of its share of samples whose token
        counts are `lengths`), every rank the same count (collectives pair up); an empty range
        (lo == hi) is a placeholder forward that contributes nothing."""
        ...

    def forward(self, samples: Sequence[Any], *, temperature: float,
                with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        ...

    def backward(self, loss: torch.Tensor) -> None:
        ...

    def reduce(self, sums: dict[str, float], how: str = "sum") -> dict[str, float]:
        ...

    def optimizer_step(self, max_grad_norm: float) -> float:
        ...

    def logprobs(self, model: torch.nn.Module, samples: Sequence[Any], *, temperature: float,
                 size: int, tokens: int = 0) -> torch.Tensor:
        ...

    def export_weights(self) -> dict[str, torch.Tensor]:
        ...

    def refresh(self) -> None:
        ...

    def reference_weights(self) -> dict[str, torch.Tensor]:
        ...

    def optimizer_state(self) -> dict[str, Any]:
        ...

    def load_optimizer_state(self, state: dict[str, Any]) -> None:
        ...


def split(lengths: Sequence[int], lo: int, hi: int, size: int, tokens: int = 0) -> list[tuple[int, int]]:
    """Consecutive ranges covering samples [lo, hi): at most `size` samples each and, when
    `tokens` > 0, at most `tokens` padded tokens -- rows x the longest row, the tensor a forward
    pass over left-padded rows allocates (a sample longer than that goes alone)."""
    out: list[tuple[int, int]] = []
    start, longest = lo, 0
    for i in range(lo, hi):
        n = lengths[i]
        if i > start and (i - start >= size or (tokens > 0 and (i - start + 1) * max(longest, n) > tokens)):
            out.append((start, i))
            start, longest = i, 0
        longest = max(longest, n)
    if hi > start:
        out.append((start, hi))
    return out


def sample_tokens(samples: Sequence[Any]) -> list[int]:
    """Each sample's tokens (prompt + completion): what a micro-batch's memory grows with."""
    return [len(s.prompt_ids) + len(s.completion_ids) for s in samples]


def precision(model: torch.nn.Module, name: str) -> contextlib.AbstractContextManager[Any]:
    """The autocast context of `TrainerConfig.precision` on the model's device ('fp32': none)."""
    if name == "fp32":
        return contextlib.nullcontext()
    device = next(model.parameters()).device.type
    return torch.autocast(device, dtype=torch.bfloat16)


def prepare(model: torch.nn.Module, config: Any) -> torch.nn.Module:
    """What every backend does to the model before training it (gradient checkpointing)."""
    if getattr(config, "gradient_checkpointing", False):
        # transformers 5 renamed it (the old name is a deprecated alias); non-reentrant works
        # with frozen inputs (LoRA) and with FSDP2's hooks
        enable = getattr(model, "activation_checkpointing_enable", None)
        if enable is not None:
            enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(  # type: ignore[operator]  # a Hugging Face method
                gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def checkpointing(config: Any) -> bool:
    """Whether the training forward recomputes activations: it then runs every sequence whole,
    since a checkpointed model keeps no KV cache to share a prompt pass through."""
    return bool(getattr(config, "gradient_checkpointing", False))
