"""The GRPO trainer on an image-text-to-text model (a tiny random LLaVA, `tests/tiny_vlm.py`):
an eval and a training step on an image domain end to end; the trainer's log-probs, recomputed
from the trajectories' stored images, equal the sampler's; images only ever sit in the context."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from posttrain.evaluation.config import EvalConfig
from posttrain.evaluation.runner import run_eval
from posttrain.scheduling.engine import WorkItem, run_episodes
from posttrain.tasks.registry import get_domain
from posttrain.training.batch import samples_from, sequence_logprobs
from posttrain.training.config import TrainerConfig
from posttrain.training.trainer import Trainer
from posttrain.values.generation import SamplingParams
from posttrain.values.trajectory import Trajectory, Turn
from tests.tiny_vlm import IMAGE_POSITIONS, tiny_vlm

CHART = "docs.chart.peak.bar"


def test_an_eval_and_a_grpo_step_on_an_image_domain(tmp_path):
    vlm = tiny_vlm()
    chart = get_domain(CHART)
    result = run_eval(vlm, [(chart, chart.task(s, "eval")) for s in range(2)],
                      EvalConfig(k=(1,), max_tokens=6, workers=1))
    assert sum(len(r.samples) for r in result.records) == 2
    assert 0.0 <= result.summary["macro_pass1"] <= 1.0

    torch.manual_seed(3)  # unseeded requests draw from the global generator: four different answers
    items = [WorkItem(chart, chart.task(s), group_id=f"g{s}") for s in range(2) for _ in range(4)]
    trajs = run_episodes(items, vlm, SamplingParams(temperature=1.0, max_tokens=6), workers=1)
    assert all(t.status == "completed" and t.turns[0].token_ids for t in trajs)
    # an untrained model fails every chart: alternate the rewards so each group has variance
    trajs = [replace(t, reward=float(i % 2)) for i, t in enumerate(trajs)]
    groups = [trajs[:4], trajs[4:]]

    trainer = Trainer(vlm, TrainerConfig(run_name="vis", lr=1e-2, weight_decay=0.0, old_logprobs="recompute"))
    samples, skipped = samples_from(trajs, [0.0] * len(trajs), image_inputs=vlm.image_inputs)
    assert skipped == 0 and all(len(s.images) == 1 for s in samples)
    image_id = vlm.model.config.image_token_index
    assert all(s.prompt_ids.count(image_id) == IMAGE_POSITIONS and image_id not in s.completion_ids
               for s in samples)  # image positions are context, never trained
    recomputed = trainer.engine.logprobs(trainer.model, samples, temperature=1.0, size=8)
    sampled = torch.tensor([lp for t in trajs for lp in t.turns[0].logprobs])
    assert recomputed.shape == sampled.shape
    assert float((recomputed - sampled).abs().max()) < 1e-4

    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    metrics = trainer.step(groups)
    assert metrics["updated"] == 1 and metrics["groups_used"] == 2
    assert math.isfinite(metrics["loss"]) and metrics["grad_norm"] > 0
    assert metrics["mismatch_abs_logp"] < 1e-4  # trainer vs sampler, with the images
    after = trainer.model.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert any("language_model" in k for k in changed)
    # the projector only gets a gradient through the image features: the pictures were in the graph
    assert any("multi_modal_projector" in k for k in changed)

    policy = trainer.vision_policy()
    assert policy.version.name == "vis/step-1"
    (again,) = run_episodes([(chart, chart.task(0))], policy, SamplingParams(temperature=1.0, max_tokens=4),
                            workers=1)
    assert again.status == "completed" and again.policy_version == "vis/step-1"

    trainer.save(tmp_path / "ckpt")
    resumed = Trainer.resume(tmp_path / "ckpt")
    assert resumed.vision is not None and resumed.step_count == 1
    assert all(torch.equal(v, resumed.model.state_dict()[k]) for k, v in after.items())
    assert resumed.vision_policy().render(again_request(chart)) == policy.render(again_request(chart))


def again_request(chart):
    from posttrain.values.generation import GenerationRequest, Message
    from posttrain.values.image import parts

    return GenerationRequest((Message("user", parts("peak?", chart.images(chart.task(0)))),), SamplingParams())


def _multiturn(vlm, images, completions, note_ids):
    """A two-turn trajectory whose second prompt extends the first prompt + answer (token-in/
    token-out) with an observation showing a second image."""
    image_id = vlm.model.config.image_token_index
    p0 = [5, 6, 7] + [image_id] * IMAGE_POSITIONS + [8]
    p1 = p0 + completions[0] + note_ids + [image_id] * IMAGE_POSITIONS + [9]
    turns = [Turn(index=0, observation="a", action="x", prompt_token_ids=p0, token_ids=completions[0],
                  logprobs=[0.0] * len(completions[0]), observation_images=[images[0].ref()]),
             Turn(index=1, observation="b", action="y", prompt_token_ids=p1, token_ids=completions[1],
                  logprobs=[0.0] * len(completions[1]), observation_images=[images[1].ref()])]
    return Trajectory(task_key="k", task_hash="h", domain=CHART, split="train", policy_version="v",
                      status="completed", reward=1.0, turns=turns, images={i.sha256: i for i in images})


@pytest.mark.parametrize("share", [True, False])
def test_images_between_turns_and_shared_prompts_compute_what_each_sequence_alone_does(share):
    vlm = tiny_vlm(seed=1)
    chart = get_domain(CHART)
    a, b, c = (chart.images(chart.task(s))[0] for s in range(3))
    assert len({a.sha256, b.sha256, c.sha256}) == 3
    # same ids, different pictures: a shared prompt pass must not mix them up
    t1 = _multiturn(vlm, [a, b], [[11, 12], [13]], [14, 15])
    t2 = _multiturn(vlm, [c, b], [[11, 12], [13]], [14, 15])
    merged, _ = samples_from([t1, t2], [1.0, -1.0], image_inputs=vlm.image_inputs)
    per_turn, _ = samples_from([t1, t2], [1.0, -1.0], image_inputs=vlm.image_inputs, merge_turns=False)
    assert [s.images for s in merged] == [(a.sha256, b.sha256), (c.sha256, b.sha256)]
    assert [s.prompt_images for s in merged] == [1, 1]
    assert [s.images for s in per_turn] == [(a.sha256,), (a.sha256, b.sha256), (c.sha256,), (c.sha256, b.sha256)]
    with torch.no_grad():
        lp_merged = sequence_logprobs(vlm.model, merged, temperature=1.0, share_prompts=share)[0]
        lp_turns = sequence_logprobs(vlm.model, per_turn, temperature=1.0, share_prompts=share)[0]
        alone = torch.cat([sequence_logprobs(vlm.model, [s], temperature=1.0)[0] for s in per_turn])
    assert lp_merged.shape == (6,)  # the generated tokens only: observations and images are context
    torch.testing.assert_close(lp_merged, alone, atol=1e-5, rtol=0)
    torch.testing.assert_close(lp_turns, alone, atol=1e-5, rtol=0)
    # the first turns of t1 and t2 differ only in their picture, and so do their log-probs
    assert not torch.allclose(alone[:2], alone[3:5])


def test_a_text_trainer_refuses_image_trajectories_by_name():
    vlm = tiny_vlm()
    chart = get_domain(CHART)
    t = _multiturn(vlm, [chart.images(chart.task(0))[0]] * 2, [[11], [12]], [13])
    with pytest.raises(ValueError, match=f"trajectory {t.id} \\({CHART}\\) showed the policy 2 image"):
        samples_from([t], [1.0])
    t.images.clear()
    with pytest.raises(ValueError, match="does not carry"):
        samples_from([t], [1.0], image_inputs=vlm.image_inputs)
