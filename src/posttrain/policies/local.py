"""`TorchPolicy`: any Hugging Face causal LM from a local path, sampled in-process.

    policy = TorchPolicy("models/tiny-base")              # or a trainer checkpoint directory
    [c] = policy.generate([GenerationRequest((Message("user", "37+48="),),
                                              SamplingParams(stop=("\\n",), max_tokens=8))])
    c.text, c.token_ids, c.logprobs                       # "85", [...], [...]

Requests are rendered by `posttrain.policies.render` (the tokenizer's chat template, else the
plain template, under which one user message is exactly the prompt text), batched up to
`max_batch_size` rows (each row keeps its own temperature, top-p, max tokens, stop strings and
seed) and fewer when their estimated memory (rows x padded length, from the model's size:
`posttrain.policies.memory`) would pass `memory_mb` (default: half the GPU's free memory, a
quarter of the machine's on the CPU), and decoded by `posttrain.policies.decode` with the
model's KV cache.

What comes back, per request:

* `text` -- the completion cut before the first stop string (EOS never appears in it).
* `token_ids` / `logprobs` -- the generated tokens up to *and including* the one that completed
  the first stop string, or the EOS token (as vLLM reports them: the stop string or EOS is the
  model's decision to end its turn, which a trainer must see and train), and each one's log-prob
  under the temperature-scaled distribution, before top-p (greedy: T=1).
* `finish_reason` -- 'stop' (EOS or a stop string), 'length' (`max_tokens`, or the model's
  context is full), 'error' (the prompt alone does not fit the context; `error` says so).

Modes (`mode=`): 'standard' decodes one token per row per step (`posttrain.policies.decode`);
'fast' decodes speculatively (`posttrain.policies.speculative`): prompt-lookup drafts by default
(no second model), or a small draft model (`draft=` a directory or module with the same
tokenizer, e.g. `models/tiny-base-draft`), verified by this model in one forward per step (at
most `verify_tokens` positions, rows x draft length: the CPU's sweet spot; raise it on a GPU).
Greedy output is standard output token for token, sampled output follows the same
distribution, log-probs are this model's. Fast mode also keeps a prefix cache (`prefix_cache_mb`, default 256
in fast mode, 0 = off in standard mode): an episode's next turn reuses the keys/values of its
earlier turns, and completions report `prefill_tokens` / `reused_tokens`.

Seeds: a request with `sampling.seed` samples from its own generator (same seed, same prompt,
same batch -> same completion); requests without one draw from torch's global RNG, which a
trainer checkpoint saves and restores.

A failure of the model as a whole (cannot load, out of memory) raises `PolicyError`.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from posttrain.policies.base import PolicyError
from posttrain.policies.decode import RowSpec, cut_at_stop, decode
from posttrain.policies.drafters import DraftModel, PromptLookup
from posttrain.policies.memory import MemoryModel, default_cap_bytes, plan_batches
from posttrain.policies.prefix_cache import PrefixCache, weights_fingerprint
from posttrain.policies.ragged import supports_ragged
from posttrain.policies.render import continue_ids, render_ids
from posttrain.policies.speculative import SpecStats
from posttrain.policies.speculative import generate as generate_ragged
from posttrain.values.generation import (
    Completion,
    GenerationRequest,
    PolicyVersion,
    SamplingParams,
)

MODES = ("standard", "fast")
FAST_PREFIX_CACHE_MB = 256.0
"""the prefix cache's default budget in fast mode (tiny-base: ~4 KB of keys/values per token)"""

VERSION_FILE = "policy_version.json"
"""written beside the weights (by `models/pretrain.py` and trainer checkpoints): name and parent"""


def weights_hash(model: torch.nn.Module) -> str:
    """sha256 over every (name, tensor) of the state dict, in name order; dtype-sensitive."""
    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(str(tensor.dtype).encode())
        h.update(tensor.detach().to("cpu").contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def tokenizer_hash(tokenizer: Any) -> str:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    body = backend.to_str() if backend is not None else json.dumps(tokenizer.get_vocab(), sort_keys=True)
    body += "\0" + str(getattr(tokenizer, "chat_template", None) or "")
    return hashlib.sha256(body.encode()).hexdigest()


def _resolve_dtype(dtype: str | torch.dtype | None) -> torch.dtype | None:
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    resolved = getattr(torch, str(dtype), None)
    if not isinstance(resolved, torch.dtype):
        raise ValueError(f"TorchPolicy dtype {dtype!r} is not a torch dtype (e.g. 'float32', 'bfloat16')")
    return resolved


def _vocab_rows(model: torch.nn.Module) -> int:
    """Rows of a Hugging Face model's output embedding (its vocabulary size as trained)."""
    embeddings = model.get_output_embeddings()  # type: ignore[operator]  # a PreTrainedModel method
    return int(embeddings.weight.shape[0])


def load_model_and_tokenizer(path: str | os.PathLike, device: str, dtype: torch.dtype | None
                             ) -> tuple[torch.nn.Module, Any]:
    """Load an HF causal LM and its tokenizer from a local directory, or raise PolicyError."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path)
    if not (path / "config.json").is_file():
        raise PolicyError(f"{path}: not a Hugging Face model directory (no config.json)")
    try:
        kwargs: dict[str, Any] = {}
        if dtype is not None:
            import transformers
            major_minor = tuple(int(x) for x in transformers.__version__.split(".")[:2])
            kwargs["dtype" if major_minor >= (4, 56) else "torch_dtype"] = dtype
        # transformers types the wrapper of PreTrainedModel.to as taking a model, not a device
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs).to(device)  # type: ignore[arg-type]
        tokenizer = AutoTokenizer.from_pretrained(path)
    except Exception as e:  # a broken directory is infrastructure, not a bad answer
        raise PolicyError(f"{path}: cannot load model/tokenizer: {type(e).__name__}: {e}") from e
    return model.eval(), tokenizer


class TorchPolicy:
    """A local torch model as a `Policy`. Build it from a directory or a loaded model."""

    def __init__(self, model: str | os.PathLike | torch.nn.Module, tokenizer: Any = None, *,
                 version: PolicyVersion | None = None, device: str | torch.device | None = None,
                 dtype: str | torch.dtype | None = None, max_batch_size: int = 256,
                 use_cache: bool = True, mode: str = "standard",
                 draft: str | os.PathLike | torch.nn.Module | None = None, max_draft: int = 16,
                 verify_tokens: int = 256, prefix_cache_mb: float | None = None,
                 memory_mb: float | None = None) -> None:
        if max_batch_size < 1:
            raise ValueError(f"TorchPolicy max_batch_size must be >= 1, got {max_batch_size}")
        if mode not in MODES:
            raise ValueError(f"TorchPolicy mode must be one of {MODES}, got {mode!r}")
        if max_draft < 1:
            raise ValueError(f"TorchPolicy max_draft must be >= 1, got {max_draft}")
        if verify_tokens < 1:
            raise ValueError(f"TorchPolicy verify_tokens must be >= 1, got {verify_tokens}")
        if draft is not None and mode != "fast":
            raise ValueError(f"TorchPolicy draft= is only used with mode='fast' (got mode={mode!r})")
        if prefix_cache_mb is not None and prefix_cache_mb < 0:
            raise ValueError(f"TorchPolicy prefix_cache_mb must be >= 0, got {prefix_cache_mb}")
        if memory_mb is not None and memory_mb <= 0:
            raise ValueError(f"TorchPolicy memory_mb must be > 0, got {memory_mb}")
        self.path: Path | None = None
        if isinstance(model, torch.nn.Module):
            if tokenizer is None:
                raise ValueError("TorchPolicy(model=<module>) needs its tokenizer")
            self.model = model
        else:
            self.path = Path(model)
            dev = str(device or ("cuda" if torch.cuda.is_available() else "cpu"))
            self.model, loaded_tok = load_model_and_tokenizer(self.path, dev, _resolve_dtype(dtype))
            tokenizer = tokenizer or loaded_tok
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.memory = MemoryModel.of(self.model)
        self.memory_cap = int(memory_mb * 2**20) if memory_mb is not None else default_cap_bytes(self.device)
        self.use_cache = use_cache
        self._lock = threading.Lock()
        self._pieces: dict[int, str] = {}  # token id -> its text decoded alone (stop checks)
        self.version = version or self._version_from_path()
        config = self.model.config
        self.accepts_images = False  # a causal LM over text (image-text models: `VisionPolicy`)
        self.max_positions: int | None = (getattr(config, "max_position_embeddings", None)
                                          or getattr(config, "n_positions", None))
        eos: set[int] = set()
        for source in (tokenizer.eos_token_id,
                       getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)):
            eos.update([source] if isinstance(source, int) else list(source or []))
        self.eos_ids = eos
        pad = tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else (min(eos) if eos else 0)
        probe = tokenizer("Hello world, 12 + 3 = 15.\n  (x)", add_special_tokens=False)["input_ids"]
        self._piecewise = self._text(probe) == "".join(self._text([i]) for i in probe)
        self.mode, self.max_draft, self.verify_tokens = mode, max_draft, verify_tokens
        self.spec_stats = SpecStats()
        self.draft_model = None if draft is None else self._load_draft(draft)
        mb = prefix_cache_mb if prefix_cache_mb is not None else (FAST_PREFIX_CACHE_MB if mode == "fast" else 0.0)
        self.prefix_cache = PrefixCache(int(mb * 2**20)) if mb > 0 else None
        if mode == "fast" or self.prefix_cache is not None:
            if not use_cache:
                raise ValueError("TorchPolicy mode='fast' and the prefix cache need use_cache=True")
            why = supports_ragged(self.model)
            if why is not None:
                raise ValueError(f"TorchPolicy mode='fast' / prefix cache: model "
                                 f"{self.path or type(self.model).__name__} is not supported: {why}")

    def _load_draft(self, draft: str | os.PathLike | torch.nn.Module) -> torch.nn.Module:
        """The draft model, on this model's device, checked to share its vocabulary."""
        if isinstance(draft, torch.nn.Module):
            model = draft
        else:
            model, tok = load_model_and_tokenizer(draft, str(self.device), None)
            if tok.get_vocab() != self.tokenizer.get_vocab():
                raise ValueError(f"TorchPolicy draft {draft}: its tokenizer's vocabulary differs from the model's")
        vocab = _vocab_rows(model)
        if vocab != _vocab_rows(self.model):
            raise ValueError(f"TorchPolicy draft {draft}: vocabulary size {vocab} != the model's")
        positions = getattr(model.config, "max_position_embeddings", None) or getattr(model.config, "n_positions", None)
        if self.max_positions is not None and positions is not None and positions < self.max_positions:
            raise ValueError(f"TorchPolicy draft {draft}: context of {positions} positions is shorter "
                             f"than the model's {self.max_positions}")
        why = supports_ragged(model)
        if why is not None:
            raise ValueError(f"TorchPolicy draft {draft} is not supported: {why}")
        return model.eval()

    def _version_from_path(self) -> PolicyVersion:
        name, parent = (self.path.name if self.path else "model"), None
        if self.path is not None and (self.path / VERSION_FILE).is_file():
            stored = json.loads((self.path / VERSION_FILE).read_text())
            name, parent = stored.get("name", name), stored.get("parent")
        return PolicyVersion(name=name, parent=parent, weights_hash=weights_hash(self.model),
                             tokenizer_hash=tokenizer_hash(self.tokenizer))

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def render(self, request: GenerationRequest) -> list[int]:
        """The prompt's ids: token-in/token-out when the request carries the episode's ids so far
        (`prefix_ids`), else the rendered messages (`posttrain.policies.render`)."""
        if request.prefix_ids is not None:
            ids = continue_ids(self.tokenizer, request.prefix_ids, request.messages[request.prefix_messages:])
            if ids is not None:
                return ids
        return render_ids(self.tokenizer, request.messages)

    def _text(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True,
                                     clean_up_tokenization_spaces=False)

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        """Complete every request, in order (see the module docstring for what comes back)."""
        rendered: dict[tuple, list[int]] = {}  # a GRPO group repeats its prompt: render it once
        keys = [(r.messages, r.prefix_ids) for r in requests]
        prompts = [rendered[k] if k in rendered else rendered.setdefault(k, self.render(r))
                   for k, r in zip(keys, requests)]
        return self.generate_ids(prompts, [r.sampling for r in requests])

    def generate_ids(self, prompts: Sequence[Sequence[int]], sampling: Sequence[SamplingParams]
                     ) -> list[Completion]:
        """Complete already-tokenised prompts (no rendering), one SamplingParams per prompt."""
        if len(prompts) != len(sampling):
            raise ValueError(f"generate_ids: {len(prompts)} prompts but {len(sampling)} sampling params")
        out: list[Completion] = []
        limit = self.max_positions
        lengths = [(len(p), len(p) + s.max_tokens if limit is None else min(limit, len(p) + s.max_tokens))
                   for p, s in zip(prompts, sampling)]
        with self._lock:
            for lo, hi in plan_batches(lengths, self.memory, self.memory_cap, self.max_batch_size):
                out.extend(self._generate_batch([list(p) for p in prompts[lo:hi]], list(sampling[lo:hi])))
        return out

    def _generate_batch(self, prompts: list[list[int]], sampling: list[SamplingParams]
                        ) -> list[Completion]:
        rows = [RowSpec(prompt_ids=p, temperature=s.temperature, top_p=s.top_p,
                        max_tokens=s.max_tokens, seed=s.seed) for s, p in zip(sampling, prompts)]
        stops = [tuple(x for x in s.stop if x) for s in sampling]
        # Each row's recent text, grown one token at a time when the tokenizer's tokens decode
        # piece by piece to the same text (character and byte-level BPE tokenizers do): decoding
        # the whole completion every step costs more than a tiny model's forward pass. Otherwise
        # (SentencePiece drops a lone token's leading space) the last `span` tokens are decoded
        # together. The final text below is decoded whole and cut again at the first stop.
        tails = [""] * len(prompts)
        span = [max(map(len, s), default=0) + 16 for s in stops]

        def stop_check(row: int, ids: list[int]) -> bool:
            if not stops[row]:
                return False
            if self._piecewise:
                piece = self._pieces.get(ids[-1])
                if piece is None:
                    piece = self._pieces[ids[-1]] = self._text([ids[-1]])
                tails[row] = (tails[row] + piece)[-span[row]:]
            else:
                tails[row] = self._text(ids[-span[row]:])
            return any(s in tails[row] for s in stops[row])

        t0 = time.perf_counter()
        was_training = self.model.training
        self.model.eval()
        try:
            if self.mode == "fast" or self.prefix_cache is not None:
                if self.prefix_cache is not None:
                    self.prefix_cache.check_weights(weights_fingerprint(self.model))
                drafter = None
                if self.mode == "fast":
                    drafter = (PromptLookup() if self.draft_model is None
                               else DraftModel(self.draft_model, self.pad_id))
                results = generate_ragged(self.model, rows, pad_id=self.pad_id, eos_ids=self.eos_ids,
                                          max_positions=self.max_positions, stop_check=stop_check,
                                          drafter=drafter, prefix_cache=self.prefix_cache,
                                          max_draft=self.max_draft, verify_tokens=self.verify_tokens,
                                          stats=self.spec_stats)
            else:
                results = decode(self.model, rows, pad_id=self.pad_id, eos_ids=self.eos_ids,
                                 max_positions=self.max_positions, stop_check=stop_check,
                                 use_cache=self.use_cache)
        except (RuntimeError, ValueError) as e:  # OOM, device errors, a model that cannot run
            raise PolicyError(f"policy {self.version.name}: generation failed: "
                              f"{type(e).__name__}: {e}") from e
        finally:
            self.model.train(was_training)
        batch_s = time.perf_counter() - t0
        # each completion's share of the batch (Completion.gen_s), by the tokens it decoded
        work = [len(res.token_ids) + 1 for res in results]
        shares = [batch_s * w / sum(work) for w in work]
        out = []
        for prompt, stop, res, gen_s in zip(prompts, stops, results, shares):
            if res.finish_reason == "context":
                out.append(Completion(  # worded like vLLM's, which OpenAIPolicy recognises
                    text="", finish_reason="error", prompt_token_ids=prompt, gen_s=gen_s, context_exceeded=True,
                    error=f"prompt of {len(prompt)} tokens does not fit the model's maximum context "
                          f"length of {self.max_positions} tokens"))
                continue
            text, ids, logprobs = cut_at_stop(self._text, res.token_ids, res.logprobs, stop)
            out.append(Completion(text=text, finish_reason=res.finish_reason,  # type: ignore[arg-type]
                                  prompt_token_ids=prompt, token_ids=ids, logprobs=logprobs,
                                  gen_s=gen_s, prefill_tokens=len(prompt) - res.reused_tokens,
                                  reused_tokens=res.reused_tokens))
        return out
