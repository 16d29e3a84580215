"""Trainer options for real models: gradient checkpointing (same numbers, less memory) and bf16
autocast (a step runs in bfloat16 and lands close to float32's)."""

from __future__ import annotations

import pytest
import torch

from posttrain.training.config import TrainerConfig
from posttrain.training.engines.parity import MODEL, batches
from posttrain.training.trainer import Trainer


@pytest.fixture(autouse=True)
def one_thread():
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def data():
    return batches(MODEL, 2)


def _train(data, **options) -> tuple[Trainer, list[dict[str, float]]]:
    # two epochs: the second update's ratio is off 1, so the loss is far from 0
    trainer = Trainer(MODEL, TrainerConfig(lr=1e-3, ppo_epochs=2, micro_batch_size=8, **options))
    return trainer, [trainer.step(groups) for groups in data]


def _checkpointed(model: torch.nn.Module) -> bool:
    return any(getattr(m, "gradient_checkpointing", False) for m in model.modules())


@pytest.mark.slow
def test_gradient_checkpointing_gives_the_same_loss_and_gradients(data):
    plain, a = _train(data)
    ckpt, b = _train(data, gradient_checkpointing=True)
    assert _checkpointed(ckpt.engine.model) and not _checkpointed(plain.engine.model)
    for x, y in zip(a, b, strict=True):
        assert x["loss"] != 0
        # the recomputed activations are the same float ops: equal up to rounding
        assert y["loss"] == pytest.approx(x["loss"], rel=1e-5, abs=1e-7)
        assert y["grad_norm"] == pytest.approx(x["grad_norm"], rel=1e-5)
    # parameter by parameter: one update from the same weights (the gradients stay until zeroed)
    grads = []
    for options in ({}, {"gradient_checkpointing": True}):
        trainer = Trainer(MODEL, TrainerConfig(lr=1e-3, micro_batch_size=8, **options))
        trainer.step(data[0])
        grads.append({n: p.grad for n, p in trainer.engine.model.named_parameters()})
    assert grads[0].keys() == grads[1].keys()
    for name, g in grads[0].items():
        assert g is not None and g.abs().sum() > 0, name
        torch.testing.assert_close(grads[1][name], g, rtol=1e-4, atol=1e-7, msg=name)


def test_bf16_autocast_runs_in_bfloat16_close_to_float32(data):
    from posttrain.training.advantages import select_groups
    from posttrain.training.batch import samples_from

    fp32 = Trainer(MODEL, TrainerConfig(lr=1e-3, ppo_epochs=2, micro_batch_size=8))
    bf16 = Trainer(MODEL, TrainerConfig(lr=1e-3, ppo_epochs=2, micro_batch_size=8, precision="bf16"))
    sel = select_groups(data[0], scale_by_std=True, eps=1e-4, filter_zero_variance=True, min_group_size=2)
    samples, _ = samples_from(sel.trajectories, sel.advantages)
    lp32, lp16 = (t.engine.logprobs(t.engine.model, samples, temperature=1.0, size=8) for t in (fp32, bf16))
    # bfloat16 keeps 8 bits of mantissa: log-probs move by ~1e-2, not by more
    assert (lp16 != lp32).any() and float((lp16 - lp32).abs().mean()) < 0.05
    seen: set[torch.dtype] = set()
    linear = next(m for m in bf16.engine.model.modules() if isinstance(m, torch.nn.Linear))
    linear.register_forward_hook(lambda _m, _i, out: seen.add(out.dtype))
    a, b = fp32.step(data[0]), bf16.step(data[0])
    assert seen == {torch.bfloat16}  # the training forward's matmuls ran in bfloat16
    assert all(p.dtype == torch.float32 for p in bf16.model.parameters())  # weights stay fp32
    assert b["updated"] == 1 and b["grad_norm"] == pytest.approx(a["grad_norm"], rel=0.1)
    print("bf16 vs fp32:", float((lp16 - lp32).abs().mean()), a["grad_norm"], b["grad_norm"], a["loss"], b["loss"])
