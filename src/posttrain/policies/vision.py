"""`VisionPolicy`: a Hugging Face image-text-to-text model (processor + model) as a policy.

    policy = VisionPolicy(LlavaForConditionalGeneration.from_pretrained(p), AutoProcessor.from_pretrained(p))

Rendering: the plain template of `posttrain.policies.render` (contents joined with "\\n"), with
each image part written as the processor's image token where it stands; the processor expands
each image token to the model's image positions and turns the images into pixel values.
Completions carry the prompt ids as the model saw them (image positions included), the sampled
ids and their log-probs under the sampling distribution (after temperature and top-p, as
`generate` scores them). Image placeholder tokens are never sampled (`placeholder_ids`).

Training: `Trainer(vision_policy)` trains the model; it re-runs each trajectory's stored images
through `image_inputs` (the processor's image half, the same tensors `generate` fed) and recomputes
log-probs with them. Image positions sit in the prompt, which a trainer never trains on.

What it does not do (yet): batch requests (one `generate` per request), reuse a prefix cache,
or feed token-in/token-out prefixes (`prefix_ids` is ignored: image positions would have to be
spliced, so the history is re-rendered).
"""

from __future__ import annotations

import hashlib
import io
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from posttrain.policies.render import PLAIN_SEPARATOR
from posttrain.values.generation import Completion, GenerationRequest, Message, PolicyVersion
from posttrain.values.image import Image, content_images, content_text


def _pil(img: Image) -> Any:
    from PIL import Image as PILImage

    return PILImage.open(io.BytesIO(img.data)).convert("RGB")


PLACEHOLDER_FIELDS = ("image_token_id", "video_token_id")
"""config fields of Hugging Face vision-language models naming their placeholder tokens"""


def placeholder_ids(model: Any) -> list[int]:
    """The token ids that stand for image (or video) positions in `model`'s input: context, never
    an action. The sampler never draws them and the trainer scores without them, so both see one
    distribution (a sampled placeholder would also ask the trainer's forward for a picture that
    is not there). Empty for a text model."""
    config = getattr(model, "config", None)
    ids = {getattr(config, name, None) for name in PLACEHOLDER_FIELDS}
    return sorted(i for i in ids if isinstance(i, int) and i >= 0)


def prompt_key(prompt_ids: Sequence[int], messages: Sequence[Message]) -> str:
    """A cache key for a prompt with images: its ids *and* the SHA-256 of every image in order.
    Image positions all hold the same token id, so ids alone would make two prompts that differ
    only in their pictures share keys/values."""
    h = hashlib.sha256(",".join(map(str, prompt_ids)).encode())
    for m in messages:
        for img in content_images(m.content):
            h.update(b"|" + img.sha256.encode())
    return h.hexdigest()


class VisionPolicy:
    accepts_images = True

    def __init__(self, model: Any, processor: Any, *, version: PolicyVersion | None = None,
                 image_token: str | None = None, path: str | Path | None = None) -> None:
        self.model = model.eval()
        self.path = Path(path) if path is not None else None
        """the directory the weights were read from (None: built in memory)"""
        self.processor = processor
        self.tokenizer = processor.tokenizer
        self.image_token = image_token or getattr(processor, "image_token", None) or "<image>"
        self.version = version or PolicyVersion(name=type(model).__name__)
        text_config = getattr(model.config, "text_config", model.config)
        self.max_positions: int | None = getattr(text_config, "max_position_embeddings", None)
        self._lock = threading.Lock()  # seeding is process-global in torch

    @classmethod
    def load(cls, path: str | Path, *, version: PolicyVersion | None = None) -> VisionPolicy:
        """A saved image-text-to-text model and its processor (e.g. a trainer's checkpoint)."""
        from transformers import AutoModelForImageTextToText, AutoProcessor

        return cls(AutoModelForImageTextToText.from_pretrained(path), AutoProcessor.from_pretrained(path),
                   version=version, path=path)

    def _inputs(self, messages: Sequence[Message]) -> dict[str, Any]:
        text = PLAIN_SEPARATOR.join(content_text(m.content, image_placeholder=self.image_token) for m in messages)
        images = [_pil(img) for m in messages for img in content_images(m.content)]
        return dict(self.processor(images=images or None, text=[text], return_tensors="pt"))

    def image_inputs(self, images: Sequence[Image]) -> dict[str, Any]:
        """The model's image tensors for `images` (pixel values, and sizes or grids where the model
        takes them), batched along dim 0: what `generate` fed with these images, for a trainer."""
        return dict(self.processor.image_processor(images=[_pil(img) for img in images], return_tensors="pt"))

    def render(self, request: GenerationRequest) -> list[int]:
        return self._inputs(request.messages)["input_ids"][0].tolist()

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        return [self._one(r) for r in requests]

    def _one(self, request: GenerationRequest) -> Completion:
        import torch

        t0 = time.perf_counter()
        s = request.sampling
        inputs = self._inputs(request.messages)
        prompt_ids = inputs["input_ids"][0].tolist()
        if self.max_positions is not None and len(prompt_ids) >= self.max_positions:
            return Completion(text="", finish_reason="error", context_exceeded=True, prompt_token_ids=prompt_ids,
                              error=f"prompt of {len(prompt_ids)} positions does not fit the model's "
                                    f"{self.max_positions}")
        room = None if self.max_positions is None else self.max_positions - len(prompt_ids)
        max_new = s.max_tokens if room is None else min(s.max_tokens, room)
        sample = s.temperature > 0
        with self._lock, torch.no_grad():
            if s.seed is not None:
                torch.manual_seed(s.seed)
            out = self.model.generate(**inputs, max_new_tokens=max_new, do_sample=sample,
                                      temperature=s.temperature if sample else None,
                                      top_p=s.top_p if sample else None, top_k=0 if sample else None,
                                      suppress_tokens=placeholder_ids(self.model) or None,
                                      output_scores=True, return_dict_in_generate=True,
                                      pad_token_id=self.tokenizer.pad_token_id or self.tokenizer.eos_token_id)
            scores = self.model.compute_transition_scores(out.sequences, out.scores, normalize_logits=True)
        ids = out.sequences[0, len(prompt_ids):].tolist()
        logprobs = [float(x) for x in scores[0][:len(ids)]]
        eos = self.tokenizer.eos_token_id
        reason: Literal["stop", "length"] = "length"
        if eos is not None and eos in ids:
            cut = ids.index(eos)
            ids, logprobs, reason = ids[:cut], logprobs[:cut], "stop"
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        for k in range(1, len(ids) + 1):  # the shortest prefix that reaches a stop string
            piece = self.tokenizer.decode(ids[:k], skip_special_tokens=True)
            hit = min((piece.find(x) for x in s.stop if x in piece), default=-1)
            if hit >= 0:
                ids, logprobs, text, reason = ids[:k], logprobs[:k], piece[:hit], "stop"
                break
        return Completion(text=text, finish_reason=reason, prompt_token_ids=prompt_ids, token_ids=ids,
                          logprobs=logprobs, gen_s=time.perf_counter() - t0,
                          prefill_tokens=len(prompt_ids))
