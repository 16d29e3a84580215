"""`VisionPolicy`: a Hugging Face image-text-to-text model (processor + model) as a policy.

    policy = VisionPolicy(LlavaForConditionalGeneration.from_pretrained(p), AutoProcessor.from_pretrained(p))

Rendering: the plain template of `posttrain.policies.render` (contents joined with "\\n"), with
each image part written as the processor's image token where it stands; the processor expands
each image token to the model's image positions and turns the images into pixel values.
Generation: the batched decode loop of `TorchPolicy` (`posttrain.policies.decode`): up to
`max_batch_size` requests left-padded into one prompt pass that takes every row's images, then one
token per step over the KV cache, each row with its own temperature, top-p, seed, token budget
and stop strings, so a request completes as it would alone (up to float rounding). What comes
back is what `TorchPolicy` returns: the prompt ids as the model saw them (image positions
included), the sampled ids up to and including EOS or the stop string's last token, and each
one's log-prob under the temperature-scaled distribution before top-p -- what a trainer
recomputes. Image placeholder tokens are never sampled (`placeholder_ids`).

Training: `Trainer(vision_policy)` trains the model; it re-runs each trajectory's stored images
through `image_inputs` (the processor's image half, the same tensors generation fed) and
recomputes log-probs with them. Image positions sit in the prompt, which a trainer never trains on.

Token-in/token-out: a request carrying the episode's ids so far (`prefix_ids`: the previous
prompt as the model saw it, image positions included, then the completion as sampled) is
rendered as those ids followed by the new messages only ("\n" + their contents, their images
expanded by the processor), as `posttrain.policies.render.continue_ids` does for text: the
history is never re-tokenized. Other requests (and `message_ids`, a context policy's edited
history) are rendered whole.

Prefix cache (`prefix_cache_mb` > 0, off by default): an episode's next turn reuses the
keys/values of its earlier turns (`posttrain.policies.vision_decode`); the cache's keys hold
each image's SHA-256 at its positions, so a prompt never reuses another picture's keys/values.
With it, a GRPO group's repeated prompt (same ids, same pictures) is computed once; without it,
every row is. Completions report `prefill_tokens` / `reused_tokens`.

What it does not do (yet): speculative decoding, or splice a context policy's `message_ids`.
"""

from __future__ import annotations

import hashlib
import io
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from posttrain.policies.decode import RowSpec, cut_at_stop, decode
from posttrain.policies.prefix_cache import PrefixCache, weights_fingerprint
from posttrain.policies.render import PLAIN_SEPARATOR
from posttrain.policies.vision_decode import decode_reusing, key_ids
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


def is_vision_model(path: str | os.PathLike) -> bool:
    """Whether the model directory `path` (a Hugging Face directory or a posttrain checkpoint)
    holds an image-text-to-text model: its config.json has a `vision_config`."""
    import json

    config = Path(path) / "config.json"
    if not config.is_file():
        return False
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False  # not ours to judge here: the text loader says what is wrong with it
    return isinstance(data, dict) and "vision_config" in data


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
                 image_token: str | None = None, path: str | os.PathLike | None = None,
                 max_batch_size: int = 16, prefix_cache_mb: float = 0.0) -> None:
        if max_batch_size < 1:
            raise ValueError(f"VisionPolicy.max_batch_size must be >= 1, got {max_batch_size}")
        if prefix_cache_mb < 0:
            raise ValueError(f"VisionPolicy.prefix_cache_mb must be >= 0, got {prefix_cache_mb}")
        self.model = model.eval()
        self.max_batch_size = max_batch_size
        """requests decoded together (one prompt pass, images included, then one token per step)"""
        self.path = Path(path) if path is not None else None
        """the directory the weights were read from (None: built in memory)"""
        self.processor = processor
        self.tokenizer = processor.tokenizer
        self.image_token = image_token or getattr(processor, "image_token", None) or "<image>"
        self.version = version or PolicyVersion(name=type(model).__name__)
        text_config = getattr(model.config, "text_config", model.config)
        self.max_positions: int | None = getattr(text_config, "max_position_embeddings", None)
        self._lock = threading.Lock()  # one decode at a time: unseeded rows share torch's global RNG
        self.placeholders = set(placeholder_ids(model))
        self._positions: dict[str, int] = {}  # image sha256 -> the placeholder positions it fills
        self.prefix_cache = PrefixCache(int(prefix_cache_mb * 2**20)) if prefix_cache_mb > 0 else None
        if self.prefix_cache is not None:
            from posttrain.policies.ragged import supports_ragged

            why = supports_ragged(self.model)
            if why is not None:
                raise ValueError(f"VisionPolicy prefix cache: model {type(model).__name__} is not supported: {why}")

    @classmethod
    def load(cls, path: str | os.PathLike, *, version: PolicyVersion | None = None,
             **kwargs: Any) -> VisionPolicy:
        """A saved image-text-to-text model and its processor (e.g. a trainer's checkpoint). Its
        version, unless given, is named like `TorchPolicy`'s: the directory's name, or the lineage
        a checkpoint recorded, with the weights' and tokenizer's hashes."""
        from transformers import AutoModelForImageTextToText, AutoProcessor

        policy = cls(AutoModelForImageTextToText.from_pretrained(path), AutoProcessor.from_pretrained(path),
                     version=version, path=path, **kwargs)
        if version is None:
            policy.version = policy._version_from_path()
        return policy

    def _version_from_path(self) -> PolicyVersion:
        import json

        from posttrain.policies.local import VERSION_FILE, tokenizer_hash, weights_hash

        assert self.path is not None
        name, parent = self.path.resolve().name, None
        if (self.path / VERSION_FILE).is_file():
            stored = json.loads((self.path / VERSION_FILE).read_text())
            name, parent = stored.get("name", name), stored.get("parent")
        return PolicyVersion(name=name, parent=parent, weights_hash=weights_hash(self.model),
                             tokenizer_hash=tokenizer_hash(self.tokenizer))

    def _inputs(self, messages: Sequence[Message]) -> dict[str, Any]:
        text = PLAIN_SEPARATOR.join(content_text(m.content, image_placeholder=self.image_token) for m in messages)
        images = [_pil(img) for m in messages for img in content_images(m.content)]
        return dict(self.processor(images=images or None, text=[text], return_tensors="pt"))

    def image_inputs(self, images: Sequence[Image]) -> dict[str, Any]:
        """The model's image tensors for `images` (pixel values, and sizes or grids where the model
        takes them), batched along dim 0: what `generate` fed with these images, for a trainer."""
        pil = [_pil(img) for img in images]
        out = dict(self.processor.image_processor(images=pil, return_tensors="pt"))
        pixels = out.get("pixel_values")
        if isinstance(pixels, torch.Tensor) and pixels.dim() == 5 and pixels.shape[0] == 1 and len(pil) > 1:
            # [samples, images per sample, C, H, W] (Idefics3, SmolVLM): one image per sample, so
            # a trainer can concatenate any sequences' images along dim 0
            out = dict(self.processor.image_processor(images=[[x] for x in pil], return_tensors="pt"))
        return out

    def render(self, request: GenerationRequest) -> list[int]:
        """The prompt's ids as the model sees them (each image's positions expanded):
        token-in/token-out when the request carries `prefix_ids`, else the messages rendered."""
        if request.prefix_ids is not None:
            new = request.messages[request.prefix_messages:]
            tail = PLAIN_SEPARATOR + PLAIN_SEPARATOR.join(
                content_text(m.content, image_placeholder=self.image_token) for m in new)
            images = [_pil(img) for m in new for img in content_images(m.content)]
            ids = self.processor(images=images or None, text=[tail], return_tensors="pt",
                                 add_special_tokens=False)["input_ids"][0].tolist()
            return list(request.prefix_ids) + ids
        return self._inputs(request.messages)["input_ids"][0].tolist()

    def image_positions(self, img: Image) -> int:
        """How many placeholder positions the processor expands `img` to (remembered by hash)."""
        n = self._positions.get(img.sha256)
        if n is None:
            ids = self.processor(images=[_pil(img)], text=[self.image_token], return_tensors="pt")["input_ids"][0]
            n = sum(1 for t in ids.tolist() if t in self.placeholders)
            if len(self._positions) >= 65536:
                self._positions.clear()
            self._positions[img.sha256] = n
        return n

    def _text(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        """Complete every request, in order, in batches of at most `max_batch_size` (see the
        module docstring for what comes back)."""
        out: list[Completion] = []
        with self._lock:
            for lo in range(0, len(requests), self.max_batch_size):
                out += self._batch(requests[lo:lo + self.max_batch_size])
        return out

    def _batch(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        t0 = time.perf_counter()
        rendered: dict[tuple, list[int]] = {}  # a GRPO group repeats its prompt: render it once
        keys = [(r.messages, r.prefix_ids, r.prefix_messages) for r in requests]
        prompts = [rendered[k] if k in rendered else rendered.setdefault(k, self.render(r))
                   for k, r in zip(keys, requests)]
        out: list[Completion | None] = [None] * len(requests)
        todo = []
        for i, ids in enumerate(prompts):
            if self.max_positions is not None and len(ids) >= self.max_positions:
                out[i] = Completion(text="", finish_reason="error", context_exceeded=True, prompt_token_ids=ids,
                                    error=f"prompt of {len(ids)} positions does not fit the model's "
                                          f"{self.max_positions}")
            else:
                todo.append(i)
        if todo:
            sampling = [requests[i].sampling for i in todo]
            rows = [RowSpec(prompt_ids=prompts[i], temperature=s.temperature, top_p=s.top_p,
                            max_tokens=s.max_tokens, seed=s.seed) for i, s in zip(todo, sampling)]
            stops = [tuple(x for x in s.stop if x) for s in sampling]
            span = [max(map(len, st), default=0) + 16 for st in stops]

            def stop_check(row: int, ids: list[int]) -> bool:
                return bool(stops[row]) and any(x in self._text(ids[-span[row]:]) for x in stops[row])

            eos = self.tokenizer.eos_token_id
            common: dict[str, Any] = dict(pad_id=self.tokenizer.pad_token_id or eos or 0,
                                          eos_ids=set() if eos is None else {eos}, max_positions=self.max_positions,
                                          stop_check=stop_check, never=sorted(self.placeholders))
            shown = [[img for m in requests[i].messages for img in content_images(m.content)] for i in todo]
            if self.prefix_cache is not None:
                self.prefix_cache.check_weights(weights_fingerprint(self.model))
                keyed = []
                for i, imgs in zip(todo, shown):
                    try:
                        keyed.append(key_ids(prompts[i], imgs, [self.image_positions(x) for x in imgs],
                                             self.placeholders))
                    except ValueError as e:
                        raise ValueError(f"VisionPolicy request {i}: {e}") from e
                results = decode_reusing(self.model, rows, keys=[k for k, _ in keyed], spans=[s for _, s in keyed],
                                         images=shown, image_inputs=self.image_inputs, cache=self.prefix_cache,
                                         **common)
            else:
                images = [img for imgs in shown for img in imgs]
                results = decode(self.model, rows, prefill_inputs=self.image_inputs(images) if images else None,
                                 **common)
            gen_s = (time.perf_counter() - t0) / len(todo)
            for i, res, st in zip(todo, results, stops):
                text, ids, logprobs = cut_at_stop(self._text, res.token_ids, res.logprobs, st)
                out[i] = Completion(text=text, finish_reason=res.finish_reason,  # type: ignore[arg-type]
                                    prompt_token_ids=prompts[i], token_ids=ids, logprobs=logprobs,
                                    gen_s=gen_s, prefill_tokens=len(prompts[i]) - res.reused_tokens,
                                    reused_tokens=res.reused_tokens)
        return [c for c in out if c is not None]
