"""`VisionPolicy` on a tiny randomly initialised LLaVA built from a config here (nothing is
downloaded): image episodes run end to end, the images reach the model, cache keys see them."""

from __future__ import annotations

from pathlib import Path

import pytest

from posttrain.policies.vision import VisionPolicy, prompt_key
from posttrain.scheduling.engine import run_episodes
from posttrain.tasks.registry import get_domain
from posttrain.values.generation import GenerationRequest, Message, SamplingParams
from posttrain.values.image import parts

MODEL = Path(__file__).resolve().parents[1] / "models" / "tiny-base"


@pytest.fixture(scope="module")
def vlm() -> VisionPolicy:
    import torch
    from transformers import (
        AutoTokenizer,
        CLIPImageProcessor,
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
    )

    tok = AutoTokenizer.from_pretrained(MODEL)
    tok.add_special_tokens({"additional_special_tokens": ["<image>"]})
    vision = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                              image_size=32, patch_size=8)
    text = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                       num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=1024)
    config = LlavaConfig(vision_config=vision, text_config=text, vision_feature_layer=-1,
                         image_token_index=tok.convert_tokens_to_ids("<image>"))
    torch.manual_seed(0)
    model = LlavaForConditionalGeneration(config)
    processor = LlavaProcessor(image_processor=CLIPImageProcessor(size={"shortest_edge": 32},
                                                                   crop_size={"height": 32, "width": 32}),
                               tokenizer=tok, patch_size=8, vision_feature_select_strategy="full",
                               num_additional_image_tokens=0)
    return VisionPolicy(model, processor)


def test_image_episodes_run_end_to_end_on_a_tiny_vlm(vlm):
    chart = get_domain("docs.chart.peak.bar")
    trajs = run_episodes([(chart, chart.task(s)) for s in range(2)], vlm, SamplingParams(temperature=1.0, seed=1),
                         workers=1)
    for t in trajs:
        assert t.status == "completed" and t.reward is not None  # graded (an untrained model fails)
        (turn,) = t.turns
        assert len(turn.observation_images) == 1
        image_id = vlm.processor.tokenizer.convert_tokens_to_ids("<image>")
        assert turn.prompt_token_ids.count(image_id) == 16  # 32x32 pixels in 8x8 patches
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
