"""Tiny randomly initialised vision-language models built from configs around the shipped
tiny-base tokenizer: nothing is downloaded.

* `tiny_vlm`: LLaVA (CLIP vision tower + Llama language model); 32x32 images in 8x8 patches make
  16 image positions per image, one run of image tokens.
* `tiny_idefics3`: Idefics3 (SmolVLM's architecture: SigLIP-style vision tower, pixel-shuffle
  connector, Llama language model); each image is resized to fit 32x32, its 16 patches shuffled
  into 4 image positions, written between `<fake_token_around_image><global-img>` and
  `<fake_token_around_image>`, with a pixel attention mask for the padding."""

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


IDEFICS3_IMAGE_POSITIONS = 4


def tiny_idefics3(seed: int = 0, **kwargs) -> VisionPolicy:
    import torch
    from transformers import (
        AutoTokenizer,
        Idefics3Config,
        Idefics3ForConditionalGeneration,
        Idefics3ImageProcessor,
        Idefics3Processor,
        Idefics3VisionConfig,
        LlamaConfig,
    )

    tok = AutoTokenizer.from_pretrained(MODEL)
    tok.add_special_tokens({"additional_special_tokens": ["<fake_token_around_image>", "<image>",
                                                          "<end_of_utterance>", "<global-img>"]})
    vision = Idefics3VisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                  image_size=32, patch_size=8)
    text = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                       num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=1024)
    config = Idefics3Config(vision_config=vision, text_config=text, scale_factor=2,
                            image_token_id=tok.convert_tokens_to_ids("<image>"))
    torch.manual_seed(seed)
    model = Idefics3ForConditionalGeneration(config)
    images = Idefics3ImageProcessor(do_image_splitting=False, size={"longest_edge": 32},
                                    max_image_size={"longest_edge": 32})
    processor = Idefics3Processor(image_processor=images, tokenizer=tok, image_seq_len=IDEFICS3_IMAGE_POSITIONS)
    return VisionPolicy(model, processor, **kwargs)
