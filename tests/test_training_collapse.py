"""A wrong answer the policy settled on is pushed down (`TrainerConfig.collapse_penalty`)."""

from __future__ import annotations

import pytest
import torch

from posttrain.training.advantages import collapsed_answer, select_groups
from posttrain.training.batch import Sample, sequence_logprobs
from posttrain.training.config import TrainerConfig
from posttrain.training.trainer import Trainer
from posttrain.values.trajectory import Trajectory, Turn
from posttrain.values.verdict import Verdict
from tests.test_training_replay import MODEL, sampled_group


@pytest.fixture(autouse=True)
def one_thread():
    torch.set_num_threads(1)


def answered(*actions: str, passed: bool = False) -> Trajectory:
    turns = [Turn(index=i, observation="", action=a, prompt_token_ids=[1], token_ids=[5], logprobs=[-0.1],
                  finish_reason="stop") for i, a in enumerate(actions)]
    return Trajectory(task_key="k", task_hash="h", domain="d", split="train", policy_version="v",
                      status="completed", turns=turns, reward=float(passed),
                      verdict=Verdict(passed=passed, score=float(passed)))


def test_only_a_shared_answer_of_an_all_fail_group_counts_as_collapsed():
    four, two = [answered(" 4 ") for _ in range(5)], [answered("7"), answered("7")]
    group = four + two + [answered("9")]
    assert collapsed_answer(group, 0.5) == four                      # 5 of 8 gave "4" (stripped)
    assert collapsed_answer(group, 0.75) == []                       # not 3/4 of them
    assert collapsed_answer(group[:-1] + [answered("4", passed=True)], 0.5) == []   # one passed
    assert collapsed_answer([answered("1"), answered("2")], 0.5) == []              # no two agree
    # turn for turn: the same last action after other moves is another answer
    agent = [answered("ls", "done"), answered("cat x", "done"), answered("ls", "done")]
    assert collapsed_answer(agent, 0.5) == [agent[0], agent[2]]


@pytest.mark.parametrize("keep_zero_variance", [False, True])
def test_selection_sets_collapsed_samples_apart_once(keep_zero_variance):
    collapsed = [answered("4") for _ in range(3)] + [answered("5")]
    spread = [answered("1", passed=True), answered("2")]
    sel = select_groups([collapsed, spread], collapse_penalty=0.5, filter_zero_variance=not keep_zero_variance)
    assert sel.penalized == collapsed[:3] and sel.groups_collapsed == 1 and sel.groups_zero_variance == 1
    ids = [id(t) for t in sel.trajectories + sel.penalized]
    assert len(ids) == len(set(ids))                                  # no sample twice
    assert sel.trajectories == ([collapsed[3]] if keep_zero_variance else []) + spread
    off = select_groups([collapsed, spread])
    assert off.penalized == [] and off.groups_collapsed == 0


def test_a_collapsed_failure_is_pushed_down():
    cfg = TrainerConfig(lr=1e-3, collapse_penalty=1.0, loss_agg="sequence")
    trainer = Trainer(MODEL, cfg)
    # four samples of one seed: the same answer four times, all wrong
    same = [sampled_group(trainer, "count a in aab=", "count", [0], seed=3)[0] for _ in range(4)]
    assert len({t.turns[0].action for t in same}) == 1
    kept = [Sample(same[0].turns[0].prompt_token_ids, same[0].turns[0].token_ids, None, 0.0, 0)]

    def logp(t: Trainer) -> float:
        with torch.no_grad():
            return float(sequence_logprobs(t.model, kept, temperature=1.0)[0].sum())

    before = logp(trainer)
    m = trainer.step([same])
    assert (m["collapse_groups"], m["collapse_trajectories"], m["updated"]) == (1, 4, 1)
    assert logp(trainer) < before - 0.05

    plain = Trainer(MODEL, TrainerConfig(lr=1e-3, loss_agg="sequence"))
    assert plain.step([same])["updated"] == 0                         # GRPO alone: nothing to learn


def test_collapse_settings_are_checked():
    with pytest.raises(ValueError, match="collapse_penalty"):
        TrainerConfig(collapse_penalty=-1)
    with pytest.raises(ValueError, match="collapse_share"):
        TrainerConfig(collapse_share=0)
