"""The trainer engine contract: the few calls every backend answers (verl's BaseEngine and
Tinker's API share them), so `Trainer` holds the RL logic once and a backend only moves tensors.

    engine = make_engine(model, config)
    for lo, hi in engine.micro_batches(lengths, config.micro_batch_size, tokens):  # this rank's share
        new, entropy = engine.forward(samples[lo:hi])         # differentiable log-probs
        engine.backward(loss)                                 # this micro-batch's share of the loss
    sums = engine.reduce(sums)                                # metrics summed over ranks
    grad_norm = engine.optimizer_step(max_grad_norm)          # clip, step (grads kept until zeroed)
    engine.logprobs(model, samples)                           # no-grad log-probs, every token, every rank
    engine.export_weights()                                   # full, untied state dict (rank 0)

A backend is accepted when its first steps' losses and gradient norms match the `local`
backend's on the same batches (`benchmarks/engines.py`: `fsdp_loss_rel_diff`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import torch

ENGINES = ("local", "fsdp")


class TrainEngine(Protocol):
    model: torch.nn.Module
    """the trained module (sharded by a distributed backend)"""
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
