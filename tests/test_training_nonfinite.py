"""An update whose gradient is inf or nan is skipped, never applied (it would write nan into every
weight and AdamW moment, for good); the trainer counts it and stops a run whose updates keep
being skipped, and the count survives a resume."""

from __future__ import annotations

import math

import pytest
import torch

from posttrain.policies.local import weights_hash
from posttrain.training.config import TrainerConfig
from posttrain.training.engines.base import skip_nonfinite
from posttrain.training.trainer import MAX_NONFINITE_STEPS, NonFiniteUpdates, Trainer
from tests.test_training_replay import MODEL, sampled_group


@pytest.fixture(autouse=True)
def one_thread():
    torch.set_num_threads(1)


def _poison(trainer: Trainer, epochs: set[int]) -> list[int]:
    """Make the backward passes of the given updates nan (numbered 0, 1, ... from now on);
    returns the counter of updates seen."""
    seen = [0]
    real_backward, real_step = trainer.engine.backward, trainer.engine.optimizer_step

    def backward(loss):
        real_backward(loss * math.nan if seen[0] in epochs else loss)

    def optimizer_step(max_grad_norm):
        try:
            return real_step(max_grad_norm)
        finally:
            seen[0] += 1

    trainer.engine.backward = backward  # type: ignore[method-assign]
    trainer.engine.optimizer_step = optimizer_step  # type: ignore[method-assign]
    return seen


def _optimizer_moments(trainer: Trainer) -> list[torch.Tensor]:
    return [v.clone() for s in trainer.optimizer.state.values() for v in s.values() if torch.is_tensor(v)]


def test_skip_nonfinite_drops_the_gradients_and_leaves_finite_norms_alone():
    p = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.AdamW([p])
    p.grad = torch.tensor([math.nan, 1.0])
    assert skip_nonfinite(math.nan, opt) and p.grad is None
    p.grad = torch.ones(2)
    assert not skip_nonfinite(2.0, opt) and p.grad is not None
    assert skip_nonfinite(math.inf, opt) and p.grad is None


def test_a_nan_update_is_skipped_counted_and_the_next_one_applies(tmp_path):
    trainer = Trainer(MODEL, TrainerConfig(lr=3e-3, ppo_epochs=2))
    groups = [sampled_group(trainer, "reverse abc=", "learning", [1, 0, 1, 0], seed=10)]
    trainer.step(groups)                                   # an AdamW state to keep intact
    before, moments = weights_hash(trainer.model), _optimizer_moments(trainer)
    _poison(trainer, {0, 1})                               # the next step's both updates
    m = trainer.step(groups)
    assert m["grad_nonfinite"] == 2 and m["updated"] == 1 and m["grad_norm"] == 0.0
    assert weights_hash(trainer.model) == before           # nothing applied
    assert all(torch.equal(a, b) for a, b in zip(_optimizer_moments(trainer), moments))
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())
    assert trainer.nonfinite_streak == 1 and trainer.totals["updates_nonfinite"] == 2
    assert trainer.totals["updates"] == 2                  # the first step's two only

    m = trainer.step(groups)                               # finite again: applied, streak reset
    assert m["grad_nonfinite"] == 0 and m["grad_norm"] > 0 and weights_hash(trainer.model) != before
    assert trainer.nonfinite_streak == 0 and trainer.totals["updates"] == 4


def test_one_nan_update_of_two_is_skipped_and_the_other_applied():
    trainer = Trainer(MODEL, TrainerConfig(lr=3e-3, ppo_epochs=2))
    groups = [sampled_group(trainer, "reverse abc=", "learning", [1, 0, 1, 0], seed=10)]
    before = weights_hash(trainer.model)
    _poison(trainer, {0})
    m = trainer.step(groups)
    assert m["grad_nonfinite"] == 1 and m["grad_norm"] > 0 and weights_hash(trainer.model) != before
    assert trainer.nonfinite_streak == 0                   # the step trained: no streak


def test_a_run_whose_updates_stay_nonfinite_stops_and_the_streak_survives_a_resume(tmp_path):
    trainer = Trainer(MODEL, TrainerConfig(lr=3e-3, ppo_epochs=1))
    groups = [sampled_group(trainer, "reverse abc=", "learning", [1, 0, 1, 0], seed=10)]
    _poison(trainer, set(range(100)))
    for _ in range(MAX_NONFINITE_STEPS - 1):
        assert trainer.step(groups)["grad_nonfinite"] == 1
    ckpt = trainer.save(tmp_path / "ckpt")
    with pytest.raises(NonFiniteUpdates, match=f"last {MAX_NONFINITE_STEPS} steps"):
        trainer.step(groups)
    resumed = Trainer.resume(ckpt)
    assert resumed.nonfinite_streak == MAX_NONFINITE_STEPS - 1
    _poison(resumed, set(range(100)))
    with pytest.raises(NonFiniteUpdates):
        resumed.step(groups)
