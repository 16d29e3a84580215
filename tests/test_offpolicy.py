"""Off-policy correction: the trainer recomputes log-probs, treats the sampler's as the behaviour
policy, weighs tokens by truncated importance ratios and logs the mismatch."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from posttrain.policies.local import weights_hash
from posttrain.training.config import TrainerConfig
from posttrain.training.losses import off_policy
from posttrain.training.trainer import Trainer
from tests.test_training_trainer import as_trajectory, sample_group

MODEL = Path(__file__).resolve().parents[1] / "models" / "tiny-base"


@pytest.fixture(autouse=True)
def one_thread():
    torch.set_num_threads(1)


def test_weights_and_mismatch_metrics_by_hand():
    trainer = torch.tensor([0.0, -1.0, -2.0])
    sampler = torch.tensor([-1.0, -1.0, -1.5])
    w = torch.tensor([0.5, 0.25, 0.25])
    is_w, m = off_policy(trainer, sampler, w, cap=2.0)
    assert is_w.tolist() == pytest.approx([2.0, 1.0, math.exp(-0.5)])  # e capped at 2
    assert m["mismatch_abs_logp"] == pytest.approx(0.5 * 1 + 0.25 * 0 + 0.25 * 0.5)
    assert m["mismatch_kl"] == pytest.approx(0.5 * (math.e - 2) + 0.25 * (math.exp(-0.5) - 0.5))
    assert m["tis_capped_share"] == pytest.approx(0.5)
    none, m0 = off_policy(trainer, sampler, w, cap=0.0)
    assert none is None and m0["tis_capped_share"] == 0.0 and m0["mismatch_abs_logp"] == m["mismatch_abs_logp"]


def _groups(policy, shift: float = 0.0):
    cs = sample_group(policy, "reverse abc=", n=6)
    if shift:  # a sampler that disagrees with the trainer by `shift` nats on every token
        cs = [replace(c, logprobs=[lp - shift for lp in c.logprobs]) for c in cs]
    return [[as_trajectory(c, float(i % 2)) for i, c in enumerate(cs)]]


def test_an_agreeing_sampler_changes_nothing_and_a_shifted_one_is_measured_and_capped():
    base = Trainer(MODEL, TrainerConfig(lr=1e-2))
    groups = _groups(base.policy())
    recompute = Trainer(MODEL, TrainerConfig(lr=1e-2, old_logprobs="recompute"))
    tis = Trainer(MODEL, TrainerConfig(lr=1e-2, tis_cap=2.0))
    m_re, m_tis = recompute.step(groups), tis.step(groups)
    # the sampler is the trainer here (same weights): weights ~1, the same update
    assert m_tis["tis_applied"] == 1 and m_tis["mismatch_abs_logp"] < 1e-4
    assert m_tis["tis_capped_share"] == 0.0
    assert m_tis["loss"] == pytest.approx(m_re["loss"], abs=1e-6)
    assert m_tis["grad_norm"] == pytest.approx(m_re["grad_norm"], rel=1e-4)

    shifted = _groups(Trainer(MODEL, TrainerConfig()).policy(), shift=1.0)
    capped = Trainer(MODEL, TrainerConfig(lr=1e-2, tis_cap=2.0))
    m = capped.step(shifted)
    assert m["mismatch_abs_logp"] == pytest.approx(1.0, abs=1e-3)
    assert m["mismatch_kl"] == pytest.approx(math.e - 2, abs=1e-2)
    assert m["tis_capped_share"] == pytest.approx(1.0)  # exp(1) > 2 on every token
    # capped at 2: exactly twice the policy gradient of the agreeing sampler's step
    assert m["pg_loss"] == pytest.approx(2 * m_re["pg_loss"], abs=1e-5)
    assert weights_hash(capped.model) != weights_hash(recompute.model)


def test_tis_cap_is_checked():
    with pytest.raises(ValueError, match="tis_cap"):
        TrainerConfig(tis_cap=0.5)
