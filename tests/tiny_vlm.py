"""A tiny randomly initialised LLaVA (CLIP vision tower + Llama language model) built from a
config around the shipped tiny-base tokenizer: nothing is downloaded. 32x32 images in 8x8 patches
make 16 image positions per image."""

from __future__ import annotations

from pathlib import Path

from posttrain.policies.vision import VisionPolicy

MODEL = Path(__file__).resolve().parents[1] / "models" / "tiny-base"
IMAGE_POSITIONS = 16


def tiny_vlm(seed: int = 0) -> VisionPolicy:
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
    torch.manual_seed(seed)
    model = LlavaForConditionalGeneration(config)
    processor = LlavaProcessor(image_processor=CLIPImageProcessor(size={"shortest_edge": 32},
                                                                   crop_size={"height": 32, "width": 32}),
                               tokenizer=tok, patch_size=8, vision_feature_select_strategy="full",
                               num_additional_image_tokens=0)
    return VisionPolicy(model, processor)
