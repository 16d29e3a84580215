"""`VisionPolicy` on a tiny randomly initialised LLaVA built from a config (`tests/tiny_vlm.py`,
nothing is downloaded): image episodes run end to end, the images reach the model, cache keys see them."""

from __future__ import annotations

from dataclasses import replace

import pytest

from posttrain.policies.vision import VisionPolicy, prompt_key
from posttrain.scheduling.engine import run_episodes
from posttrain.tasks.registry import get_domain
from posttrain.values.generation import GenerationRequest, Message, SamplingParams
from posttrain.values.image import parts
from tests.tiny_vlm import IMAGE_POSITIONS, tiny_vlm


@pytest.fixture(scope="module")
def vlm() -> VisionPolicy:
    return tiny_vlm()


def test_image_episodes_run_end_to_end_on_a_tiny_vlm(vlm):
    chart = get_domain("docs.chart.peak.bar")
    trajs = run_episodes([(chart, chart.task(s)) for s in range(2)], vlm, SamplingParams(temperature=1.0, seed=1),
                         workers=1)
    for t in trajs:
        assert t.status == "completed" and t.reward is not None  # graded (an untrained model fails)
        (turn,) = t.turns
        assert len(turn.observation_images) == 1
        image_id = vlm.processor.tokenizer.convert_tokens_to_ids("<image>")
        assert turn.prompt_token_ids.count(image_id) == IMAGE_POSITIONS
        assert len(turn.token_ids) == len(turn.logprobs) >= 1
        assert all(lp <= 0 for lp in turn.logprobs)


def test_the_picture_changes_what_the_model_computes(vlm):
    chart = get_domain("docs.chart.peak.bar")
    a, b = chart.images(chart.task(0))[0], chart.images(chart.task(1))[0]
    greedy = SamplingParams(temperature=0, max_tokens=6)
    ra = GenerationRequest((Message("user", parts("which quarter?", [a])),), greedy)
    rb = GenerationRequest((Message("user", parts("which quarter?", [b])),), greedy)
    assert vlm.render(ra) == vlm.render(rb)  # the same ids: image positions hold one token id
    assert prompt_key(vlm.render(ra), ra.messages) != prompt_key(vlm.render(rb), rb.messages)
    import torch

    with torch.no_grad():
        la = vlm.model(**vlm._inputs(ra.messages)).logits[0, -1]
        lb = vlm.model(**vlm._inputs(rb.messages)).logits[0, -1]
    assert not torch.allclose(la, lb)


def test_a_batch_completes_each_request_as_it_would_alone(vlm):
    chart = get_domain("docs.chart.peak.bar")
    a, b = chart.images(chart.task(0))[0], chart.images(chart.task(1))[0]
    greedy = SamplingParams(temperature=0, max_tokens=8)
    requests = [
        GenerationRequest((Message("user", parts("which quarter?", [a])),), greedy),
        GenerationRequest((Message("user", parts("a longer question: which quarter had the peak?", [b])),),
                          replace(greedy, max_tokens=3)),
        GenerationRequest((Message("user", "no picture at all"),), greedy),
        GenerationRequest((Message("user", parts("two:", [b, a])),), greedy),
        GenerationRequest((Message("user", parts("seeded", [a])),), SamplingParams(temperature=1.0, seed=7,
                                                                                     max_tokens=8)),
    ]
    alone = [vlm.generate([r])[0] for r in requests]
    # a stop string that the first request's greedy answer reaches: cut there, in the batch too
    stop = vlm._text(alone[0].token_ids[2:4])
    requests[0] = replace(requests[0], sampling=replace(greedy, stop=(stop,)))
    alone[0] = vlm.generate([requests[0]])[0]
    assert alone[0].finish_reason == "stop" and len(alone[0].token_ids) <= 4
    assert len(alone[1].token_ids) == 3 and alone[1].finish_reason == "length"
    batch = vlm.generate(requests)
    for one, many in zip(alone, batch):
        assert many.token_ids == one.token_ids and many.text == one.text
        assert many.finish_reason == one.finish_reason and many.prompt_token_ids == one.prompt_token_ids
        assert max(abs(x - y) for x, y in zip(one.logprobs, many.logprobs)) < 1e-4
    image_id = vlm.model.config.image_token_index
    assert batch[3].prompt_token_ids.count(image_id) == 2 * IMAGE_POSITIONS
    assert not any(image_id in c.token_ids for c in batch)  # placeholders are never sampled


def test_batches_are_cut_to_max_batch_size(vlm):
    small = VisionPolicy(vlm.model, vlm.processor, max_batch_size=2)
    chart = get_domain("docs.chart.peak.bar")
    greedy = SamplingParams(temperature=0, max_tokens=3)
    requests = [GenerationRequest((Message("user", parts(f"q{i}", [chart.images(chart.task(i))[0]])),), greedy)
                for i in range(3)]
    assert [c.token_ids for c in small.generate(requests)] == [c.token_ids for c in vlm.generate(requests)]
    with pytest.raises(ValueError, match="max_batch_size"):
        VisionPolicy(vlm.model, vlm.processor, max_batch_size=0)
