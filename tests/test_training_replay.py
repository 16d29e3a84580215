"""Solved domains' successes replayed in later steps (`TrainerConfig.replay_solved`)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from posttrain.policies.local import weights_hash
from posttrain.training.batch import Sample, sequence_logprobs
from posttrain.training.config import TrainerConfig
from posttrain.training.losses import token_weights
from posttrain.training.replay import SolvedReplay, all_passed
from posttrain.training.trainer import Trainer
from posttrain.values.generation import GenerationRequest, Message, SamplingParams
from posttrain.values.trajectory import ErrorInfo, Trajectory, Turn
from posttrain.values.verdict import Verdict

MODEL = Path(__file__).resolve().parents[1] / "models" / "tiny-base"


@pytest.fixture(autouse=True)
def one_thread():
    torch.set_num_threads(1)


def traj(domain: str, passed: bool | None, *, logprobs: bool = True, tokens=(5, 6), prompt=(1, 2)) -> Trajectory:
    turn = Turn(index=0, observation="", action="x", prompt_token_ids=list(prompt), token_ids=list(tokens),
                logprobs=[-0.1] * len(tokens) if logprobs else None, finish_reason="stop")
    if passed is None:
        return Trajectory(task_key="k", task_hash="h", domain=domain, split="train", policy_version="v",
                          status="infra_error", turns=[turn], error=ErrorInfo("SandboxError", "died", where="sandbox"))
    return Trajectory(task_key="k", task_hash="h", domain=domain, split="train", policy_version="v",
                      status="completed", turns=[turn], reward=float(passed),
                      verdict=Verdict(passed=passed, score=float(passed)))


def test_only_all_pass_groups_with_sampler_logprobs_are_kept_newest_first():
    r = SolvedReplay()
    pictured = traj("g", True)
    pictured.turns[0].observation_images = [{"sha256": "0" * 64, "mime": "image/png", "bytes": 1}]
    kept = r.observe([
        [traj("a", True), traj("a", True)],
        [traj("b", True), traj("b", False)],               # a reward spread: trained, not kept
        [traj("c", True), traj("c", None)],                # an infra error: not a success
        [traj("d", True, logprobs=False)] * 2,             # nothing to take the ratio against
        [traj("e", False)] * 2,                            # all failed
        [pictured, pictured],                              # its image bytes are not checkpointed
    ], step=0)
    assert kept == 1 and set(r.groups) == {"a"}
    assert not all_passed([]) and not all_passed([traj("c", True), traj("c", None)])
    newer = [traj("a", True, tokens=(7, 8, 9))] * 2
    r.observe([newer, [traj("f", True)] * 2], step=3)
    assert r.groups["a"] == newer and r.kept_at == {"a": 3, "f": 3}


def test_draw_takes_the_least_recently_replayed_first():
    r = SolvedReplay()
    r.observe([[traj(d, True)] * 2 for d in ("c", "a", "b")], step=0)
    assert [g[0].domain for g in r.draw(2, 1)] == ["a", "b"]
    assert [g[0].domain for g in r.draw(2, 2)] == ["c", "a"]      # c never replayed, then a (step 1)
    assert [g[0].domain for g in r.draw(5, 3)] == ["b", "a", "c"]  # a, c tie (step 2): by name
    assert r.draw(0, 4) == []
    state = r.state_dict()
    again = SolvedReplay()
    again.load_state_dict(state)
    assert again.state_dict() == state
    assert [g[0].domain for g in again.draw(1, 5)] == [g[0].domain for g in r.draw(1, 5)] == ["a"]
    assert len(r.draw(1, 6)[0]) == 2


@pytest.mark.parametrize("agg", ["token", "sequence"])
def test_replayed_owners_do_not_dilute_the_steps_weights(agg):
    lengths, owners = [3, 2, 4, 5], [0, 0, 1, 2]
    plain = token_weights(lengths[:3], owners[:3], agg)
    with_extra = token_weights(lengths, owners, agg, extra={2})
    assert with_extra[:3] == plain
    assert abs(sum(w for ws in with_extra[:3] for w in ws) - 1) < 1e-9
    assert sum(with_extra[3]) > 0
    only_extra = token_weights([2, 3], [0, 1], agg, extra={0, 1})    # a replay-only step
    assert abs(sum(w for ws in only_extra for w in ws) - 1) < 1e-9


def sampled_group(trainer: Trainer, prompt: str, domain: str, rewards, seed: int = 0) -> list[Trajectory]:
    requests = [GenerationRequest((Message("user", prompt),), SamplingParams(
        temperature=1.0, max_tokens=6, stop=("\n",), seed=seed + i)) for i in range(len(rewards))]
    out = []
    for c, r in zip(trainer.policy().generate(requests), rewards):
        turn = Turn(index=0, observation="", action=c.text, prompt_token_ids=c.prompt_token_ids,
                    token_ids=c.token_ids, logprobs=c.logprobs, finish_reason=c.finish_reason)
        out.append(Trajectory(task_key=prompt, task_hash=prompt, domain=domain, split="train", policy_version="v",
                              status="completed", turns=[turn], reward=float(r), sampling={"temperature": 1.0},
                              verdict=Verdict(passed=bool(r), score=float(r))))
    return out


def test_a_kept_success_is_replayed_in_later_steps_and_holds_its_probability(tmp_path):
    cfg = TrainerConfig(lr=1e-3, replay_solved=2, loss_agg="sequence")
    trainer = Trainer(MODEL, cfg)
    solved = sampled_group(trainer, "upper abc=", "solved", [1] * 4)
    learning = sampled_group(trainer, "reverse abc=", "learning", [1, 0, 1, 0], seed=10)
    m1 = trainer.step([solved, learning])
    assert (m1["replay_kept"], m1["replay_groups"], m1["replay_domains"]) == (1, 0, 1)
    assert "replay_drift" not in m1

    kept = [Sample(t.turns[0].prompt_token_ids, t.turns[0].token_ids, None, 0.0, 0) for t in solved]

    def logp(t: Trainer) -> float:
        with torch.no_grad():
            return float(sequence_logprobs(t.model, kept, temperature=1.0)[0].sum())

    ckpt = trainer.save(tmp_path / "ckpt")
    # a step whose only group all failed: nothing but the replay to learn from
    failing = sampled_group(trainer, "lower ABC=", "failing", [0] * 4, seed=20)
    m2 = trainer.step([failing])
    assert (m2["replay_groups"], m2["replay_trajectories"], m2["updated"]) == (1, 4, 1)
    assert m2["replay_drift"] > 0          # step 1's update moved the kept success's log-probs
    after_step2 = weights_hash(trainer.model)

    # a batch that samples the kept domain again still replays it (its new groups may give nothing)
    m3 = trainer.step([sampled_group(trainer, "upper abc=", "solved", [1, 0, 1, 0], seed=30)])
    assert m3["replay_groups"] == 1

    # resumed from the checkpoint: the same buffer, the same step 2 as the uninterrupted run
    resumed = Trainer.resume(ckpt)
    assert set(resumed.replay.groups) == {"solved"} and resumed.replay.kept_at == {"solved": 0}
    resumed.step([failing])
    assert weights_hash(resumed.model) == after_step2
    off = Trainer.resume(ckpt, replace(resumed.config, replay_solved=0))
    assert off.step([failing])["updated"] == 0                       # without replay: nothing to learn

    # the same update on another domain, with and without the replay: the kept success keeps more
    # of its probability with it (compared at one optimizer state: Adam's momentum from step 1
    # carries on either way)
    other = sampled_group(trainer, "reverse xyz=", "learning", [0, 1, 0, 1], seed=40)
    on = Trainer.resume(ckpt)
    off = Trainer.resume(ckpt, replace(on.config, replay_solved=0))
    on.step([other])
    off.step([other])
    assert logp(on) > logp(off)
