"""`VisionPolicy` on a tiny randomly initialised LLaVA built from a config (`tests/tiny_vlm.py`,
nothing is downloaded): image episodes run end to end, the images reach the model, cache keys see them."""

from __future__ import annotations

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
