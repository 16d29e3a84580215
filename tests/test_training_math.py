"""Advantage, loss and aggregation math against hand-computed cases; group selection; config."""

from __future__ import annotations

import math

import pytest
import torch

from posttrain.evaluation.metrics import pass_at_k
from posttrain.training.advantages import group_advantages, select_groups
from posttrain.training.config import TrainerConfig
from posttrain.training.losses import clipped_pg_loss, token_weights
from posttrain.values.trajectory import ErrorInfo, Trajectory, Turn
from posttrain.values.verdict import Verdict


def traj(reward: float | None, status: str = "completed", n_tokens: int = 2,
         finish: str = "stop") -> Trajectory:
    turn = Turn(index=0, observation="1+1=", action="2", prompt_token_ids=[1, 5],
                token_ids=list(range(7, 7 + n_tokens)), logprobs=[-1.0] * n_tokens, finish_reason=finish)
    if status == "infra_error":
        return Trajectory(task_key="k", task_hash="h", domain="d", split="train", policy_version="v",
                          status="infra_error", turns=[turn],
                          error=ErrorInfo(type="SandboxError", message="died"))
    return Trajectory(task_key="k", task_hash="h", domain="d", split="train", policy_version="v",
                      status=status, turns=[turn], reward=reward,
                      verdict=Verdict(passed=bool(reward), score=float(reward or 0)))


def test_group_advantages_hand_computed():
    # rewards 1, 0, 0, 1: mean 0.5, sample std sqrt(4 * 0.25 / 3) = 0.57735
    adv = group_advantages([1, 0, 0, 1], scale_by_std=True, eps=0.0)
    assert adv == pytest.approx([0.866025, -0.866025, -0.866025, 0.866025], abs=1e-6)
    # without std scaling: just centred
    assert group_advantages([1, 0, 0, 0], scale_by_std=False) == pytest.approx([0.75, -0.25, -0.25, -0.25])
    # eps enters the denominator: rewards 2, 0 -> std sqrt(2), A = 1 / (sqrt 2 + 0.1)
    assert group_advantages([2, 0], eps=0.1)[0] == pytest.approx(1 / (math.sqrt(2) + 0.1))
    with pytest.raises(ValueError, match="at least 2"):
        group_advantages([1.0])


def test_select_groups_filters_and_counts_zero_variance_and_infra():
    groups = [
        [traj(1), traj(0), traj(0), traj(1)],                       # used
        [traj(1), traj(1), traj(1), traj(1)],                       # zero variance
        [traj(None, "infra_error"), traj(1), traj(0, "truncated", finish="length")],  # used, 1 infra dropped
        [traj(None, "infra_error"), traj(None, "infra_error"), traj(1)],  # too small after drop
    ]
    sel = select_groups(groups)
    assert (sel.groups, sel.groups_used, sel.groups_zero_variance, sel.groups_too_small) == (4, 2, 1, 1)
    assert sel.infra_errors == 3
    assert sel.trajectories_in == 14
    assert len(sel.trajectories) == 6 and all(t.trainable for t in sel.trajectories)
    assert sel.truncated == 1 and sel.length_cut == 1  # trained on, and counted
    assert sel.advantages[4:] == pytest.approx([0.7071, -0.7071], abs=1e-3)
    kept = select_groups(groups, filter_zero_variance=False)
    assert kept.groups_zero_variance == 1 and kept.groups_used == 3
    assert kept.advantages[4:8] == [0.0] * 4


def test_token_weights_token_vs_sequence():
    # two trajectories: owner 0 has turns of 1 and 3 tokens, owner 1 one turn of 4 tokens
    tok = token_weights([1, 3, 4], [0, 0, 1], "token")
    assert [w for ws in tok for w in ws] == pytest.approx([1 / 8] * 8)
    seq = token_weights([1, 3, 4], [0, 0, 1], "sequence")
    assert seq == [[pytest.approx(1 / 8)], [pytest.approx(1 / 8)] * 3, [pytest.approx(1 / 8)] * 4]
    seq = token_weights([2, 6], [0, 1], "sequence")  # each trajectory weighs 1/2 in total
    assert sum(seq[0]) == pytest.approx(0.5) and sum(seq[1]) == pytest.approx(0.5)
    assert seq[0][0] == pytest.approx(0.25) and seq[1][0] == pytest.approx(1 / 12)
    with pytest.raises(ValueError, match="aggregation"):
        token_weights([1], [0], "median")


def test_clipped_loss_hand_computed():
    old = torch.zeros(4)
    new = torch.log(torch.tensor([1.5, 0.5, 1.1, 0.7]))  # ratios 1.5, 0.5, 1.1, 0.7
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0])
    w = torch.full((4,), 0.25)
    parts = clipped_pg_loss(new, old, adv, w, clip_low=0.2, clip_high=0.28)
    # token 0: A>0, ratio 1.5 clipped to 1.28 -> -1.28 (clipped)
    # token 1: A>0, ratio 0.5 -> min(0.5, 0.8) = 0.5 -> -0.5 (not clipped: pessimistic branch)
    # token 2: A<0, ratio 1.1 inside -> +1.1
    # token 3: A<0, ratio 0.7 -> max(0.7, 0.8) -> +0.8 (clipped)
    assert float(parts.loss) == pytest.approx(0.25 * (-1.28 - 0.5 + 1.1 + 0.8))
    assert parts.clip_fraction == pytest.approx(0.5)
    assert parts.ratio_max == pytest.approx(1.5)
    # gradient flows only through unclipped tokens
    new_leaf = new.clone().requires_grad_(True)
    clipped_pg_loss(new_leaf, old, adv, w, clip_low=0.2, clip_high=0.28).loss.backward()
    g = new_leaf.grad
    assert g[0] == 0 and g[3] == 0
    assert float(g[1]) == pytest.approx(-0.25 * 0.5) and float(g[2]) == pytest.approx(0.25 * 1.1)


def test_k3_kl_term_hand_computed():
    new = torch.tensor([0.0, -1.0])
    ref = torch.tensor([-0.5, -1.0])
    w = torch.tensor([0.5, 0.5])
    parts = clipped_pg_loss(new, new, torch.zeros(2), w, clip_low=0.2, clip_high=0.2,
                            ref_logp=ref, kl_beta=0.1)
    k3 = math.exp(-0.5) + 0.5 - 1  # exp(d) - d - 1 with d = ref - new = -0.5
    assert parts.kl == pytest.approx(0.5 * k3)
    assert float(parts.loss) == pytest.approx(0.1 * 0.5 * k3)
    no_ref = clipped_pg_loss(new, new, torch.zeros(2), w, clip_low=0.2, clip_high=0.2)
    assert no_ref.kl == 0.0 and float(no_ref.loss) == 0.0


def test_pass_at_k():
    assert pass_at_k(8, 0, 8) == 0.0
    assert pass_at_k(8, 1, 8) == 1.0
    assert pass_at_k(8, 2, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 2, 2) == pytest.approx(1 - 1 / 6)


@pytest.mark.parametrize("field,value,match", [
    ("lr", 0.0, "TrainerConfig.lr must be > 0"),
    ("clip_low", 1.5, r"TrainerConfig.clip_low must be in \[0, 1\)"),
    ("loss_agg", "mean", r"TrainerConfig\nloss_agg\n  Input should be 'token' or 'sequence'"),
    ("micro_batch_size", 0, "TrainerConfig.micro_batch_size must be an integer >= 1"),
    ("min_group_size", 1, "TrainerConfig.min_group_size"),
    ("temperature", 0.0, "TrainerConfig.temperature must be > 0"),
    ("old_logprobs", "vllm", r"TrainerConfig\nold_logprobs\n"),
    ("run_name", "a/b", "TrainerConfig.run_name"),
])
def test_bad_config_names_the_field(field, value, match):
    with pytest.raises(ValueError, match=match):
        TrainerConfig(**{field: value})


def test_config_from_dict_names_the_source_and_unknown_keys():
    cfg = TrainerConfig.from_dict({"lr": 1e-4, "betas": [0.9, 0.95]}, where="run.json:trainer")
    assert cfg.lr == 1e-4 and cfg.betas == (0.9, 0.95)
    assert TrainerConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match=r"run.json:trainer: unknown TrainerConfig field\(s\) lr_rate"):
        TrainerConfig.from_dict({"lr_rate": 1e-4}, where="run.json:trainer")
    with pytest.raises(ValueError, match="run.json:trainer: TrainerConfig.kl_beta must be >= 0"):
        TrainerConfig.from_dict({"kl_beta": -1}, where="run.json:trainer")
