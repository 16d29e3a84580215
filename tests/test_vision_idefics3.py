"""A second vision-language architecture end to end: a tiny random Idefics3 (SmolVLM's
architecture; `tests/tiny_vlm.py`, nothing downloaded). An eval and a GRPO step on an image
domain, the trainer's log-probs with the stored images equal the sampler's, and its next turn
runs token-in/token-out from the prefix cache with the same output as computing it all."""

from __future__ import annotations

import math
from dataclasses import replace

import torch

from posttrain.evaluation.config import EvalConfig
from posttrain.evaluation.runner import run_eval
from posttrain.policies.vision import VisionPolicy
from posttrain.scheduling.engine import WorkItem, run_episodes
from posttrain.tasks.registry import get_domain
from posttrain.training.batch import samples_from
from posttrain.training.config import TrainerConfig
from posttrain.training.trainer import Trainer
from posttrain.values.generation import GenerationRequest, Message, SamplingParams
from posttrain.values.image import parts
from tests.tiny_vlm import IDEFICS3_IMAGE_POSITIONS, tiny_idefics3

CHART = "docs.chart.peak.bar"


def test_an_eval_and_a_grpo_step_on_a_tiny_idefics3():
    vlm = tiny_idefics3()
    chart = get_domain(CHART)
    result = run_eval(vlm, [(chart, chart.task(s, "eval")) for s in range(2)],
                      EvalConfig(k=(1,), max_tokens=6, workers=1))
    assert sum(len(r.samples) for r in result.records) == 2
    assert 0.0 <= result.summary["macro_pass1"] <= 1.0

    torch.manual_seed(5)
    items = [WorkItem(chart, chart.task(s), group_id=f"g{s}") for s in range(2) for _ in range(2)]
    trajs = run_episodes(items, vlm, SamplingParams(temperature=1.0, max_tokens=6), workers=1)
    assert all(t.status == "completed" and t.turns[0].token_ids for t in trajs)
    image_id = vlm.model.config.image_token_id
    assert all(t.turns[0].prompt_token_ids.count(image_id) == IDEFICS3_IMAGE_POSITIONS for t in trajs)
    trajs = [replace(t, reward=float(i % 2)) for i, t in enumerate(trajs)]  # variance in each group

    trainer = Trainer(vlm, TrainerConfig(run_name="idefics3", lr=1e-2, weight_decay=0.0, old_logprobs="recompute"))
    samples, skipped = samples_from(trajs, [0.0] * len(trajs), image_inputs=vlm.image_inputs)
    assert skipped == 0 and all(image_id not in s.completion_ids for s in samples)
    recomputed = trainer.engine.logprobs(trainer.model, samples, temperature=1.0, size=8)
    sampled = torch.tensor([lp for t in trajs for lp in t.turns[0].logprobs])
    assert float((recomputed - sampled).abs().max()) < 1e-4  # the trainer saw the same pictures

    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    metrics = trainer.step([trajs[:2], trajs[2:]])
    assert metrics["updated"] == 1 and math.isfinite(metrics["loss"]) and metrics["grad_norm"] > 0
    assert metrics["mismatch_abs_logp"] < 1e-4
    changed = {k for k, v in trainer.model.state_dict().items() if not torch.equal(before[k], v)}
    assert any("text_model" in k for k in changed)
    assert any("connector" in k for k in changed)  # reached only through the image features
    assert trainer.vision_policy().version.name == "idefics3/step-1"


def test_token_in_token_out_and_the_prefix_cache_on_a_tiny_idefics3():
    plain = tiny_idefics3()
    cached = VisionPolicy(plain.model, plain.processor, prefix_cache_mb=16)
    chart = get_domain(CHART)
    a, b = (chart.images(chart.task(s))[0] for s in range(2))
    greedy = SamplingParams(temperature=0, max_tokens=5)
    first = GenerationRequest((Message("user", parts("which quarter?", [a])),), greedy)
    (one,) = cached.generate([first])
    second = GenerationRequest(first.messages + (Message("assistant", one.text), Message("user", parts("now?", [b]))),
                               greedy, prefix_ids=tuple(one.prompt_token_ids) + tuple(one.token_ids),
                               prefix_messages=2)
    (two,), (ref,) = cached.generate([second]), plain.generate([second])
    history = len(one.prompt_token_ids) + len(one.token_ids)
    assert two.prompt_token_ids[:history] == one.prompt_token_ids + one.token_ids
    assert two.reused_tokens == history - 1
    assert two.token_ids == ref.token_ids
    assert max(abs(x - y) for x, y in zip(two.logprobs, ref.logprobs)) < 1e-4
