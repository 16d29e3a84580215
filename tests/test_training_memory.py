"""Training micro-batches bounded by memory: by default a step's batch is cut so that each
micro-batch's estimated activations (`policies.memory`) stay under a cap, and the accumulated
gradient is the unsplit batch's."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from posttrain.training.config import TrainerConfig
from posttrain.training.engines.base import split
from posttrain.training.trainer import Trainer
from posttrain.values.trajectory import Trajectory, Turn
from posttrain.values.verdict import Verdict

MODEL = Path(__file__).resolve().parents[1] / "models" / "tiny-base"


@pytest.fixture(autouse=True)
def one_thread():
    torch.set_num_threads(1)


def _groups(lengths: list[tuple[int, int]], size: int = 4) -> list[list[Trajectory]]:
    """One group per (prompt, completion) length: synthetic token ids, rewards 0/1 alternating."""
    rng = random.Random(0)
    groups = []
    for g, (prompt_len, answer_len) in enumerate(lengths):
        prompt = [rng.randrange(3, 60) for _ in range(prompt_len)]
        group = []
        for i in range(size):
            turn = Turn(index=0, observation="", action="x", prompt_token_ids=prompt,
                        token_ids=[rng.randrange(3, 60) for _ in range(answer_len + i)], finish_reason="stop")
            group.append(Trajectory(task_key=f"k{g}", task_hash=f"h{g}", domain="d", split="train",
                                    policy_version="v", status="completed", turns=[turn], reward=float(i % 2),
                                    sampling={"temperature": 1.0}, verdict=Verdict(passed=bool(i % 2),
                                                                                   score=float(i % 2))))
        groups.append(group)
    return groups


def test_split_bounds_padded_tokens_and_a_long_sample_goes_alone():
    # rows are padded to the longest: four short rows and a long one are not 4 x 10 + 100 tokens
    assert split([10, 10, 10, 10, 100], 0, 5, 64, tokens=120) == [(0, 4), (4, 5)]
    assert split([10, 10, 10, 10, 100], 0, 5, 64, tokens=0) == [(0, 5)]
    assert split([50, 200, 50], 0, 3, 64, tokens=100) == [(0, 1), (1, 2), (2, 3)]
    assert split([30] * 6, 0, 6, 4, tokens=10**6) == [(0, 4), (4, 6)]


def test_the_memory_bound_shrinks_with_length_and_never_below_one_row():
    trainer = Trainer(MODEL, TrainerConfig())
    m = trainer.memory
    assert m.layers == 4 and m.logits_per_position > 0
    assert m.train_bytes_per_token(100) > m.train_bytes_per_token(10)   # attention grows with length
    cap = 64 * 2**20
    assert m.train_tokens(cap, 10) > m.train_tokens(cap, 100) >= 100
    assert m.train_tokens(1, 120) == 120                                  # one row always runs
    assert m.train_tokens(cap, 100) * m.train_bytes_per_token(100) <= cap


@pytest.mark.slow
def test_long_sequences_split_under_the_cap_with_the_unsplit_gradient():
    groups = _groups([(90, 20), (20, 5), (60, 30), (10, 10), (80, 25)])
    probe = Trainer(MODEL, TrainerConfig())
    longest = max(len(t.turns[0].prompt_token_ids) + len(t.turns[0].token_ids) for g in groups for t in g)
    # a cap that fits about two of the longest rows
    mb = 2.5 * longest * probe.memory.train_bytes_per_token(longest) / 2**20

    grads, metrics = [], []
    for cfg in (TrainerConfig(micro_batch_tokens=0, max_grad_norm=0.0, old_logprobs="recompute"),
                TrainerConfig(micro_batch_memory_mb=mb, max_grad_norm=0.0, old_logprobs="recompute")):
        trainer = Trainer(MODEL, cfg)
        trainer.optimizer.step = lambda: None  # keep the accumulated gradient to compare it
        metrics.append(trainer.step(groups))
        grads.append(torch.cat([p.grad.flatten() for p in trainer.model.parameters()]))
    unsplit, capped = metrics
    assert unsplit["micro_batches"] == 1 and capped["micro_batches"] >= 8
    assert capped["micro_batch_tokens"] == pytest.approx(2.5 * longest, abs=1)
    # each micro-batch's padded tokens (so its estimated memory) under the bound
    assert capped["micro_batch_tokens"] * probe.memory.train_bytes_per_token(longest) <= mb * 2**20
    assert grads[0].abs().max() > 1e-3
    assert torch.allclose(grads[0], grads[1], atol=1e-6, rtol=1e-4)
    assert capped["loss"] == pytest.approx(unsplit["loss"], abs=1e-6)


def test_the_default_bound_leaves_a_small_batch_whole():
    trainer = Trainer(MODEL, TrainerConfig())   # 'auto': a quarter of the machine's memory on the CPU
    assert trainer.config.micro_batch_tokens == "auto"
    m = trainer.step(_groups([(20, 5), (30, 6)]))
    assert m["micro_batches"] == 1 and m["micro_batch_tokens"] > 10_000
