"""`OpenAIPolicy`: any OpenAI-compatible server (vLLM, SGLang, `posttrain.policies.serve`).

    policy = OpenAIPolicy(OpenAIConfig(base_url="http://127.0.0.1:8000/v1", model="tiny-base"))
    completions = policy.generate(requests)

Two APIs (`OpenAIConfig.api`):

* `completions` -- the messages are rendered *here* (the tokenizer's chat template when a
  `tokenizer` is given and has one, else the plain template of `posttrain.policies.render`) and
  sent as a raw prompt: what a base model needs, and what keeps token ids comparable.
* `chat` -- the messages are sent as they are; the server applies its own chat template. Image
  content goes as OpenAI `image_url` parts with base64 data URIs (`posttrain.values.image`).

Token ids and log-probs come back where the server returns them: log-probs through the standard
`logprobs` field, token ids through vLLM's `return_token_ids` extension (`token_ids`,
`prompt_token_ids` on each choice). Without token ids a completion has `token_ids=None` (a
trainer cannot learn from it; it counts such turns). Which temperature the log-probs are taken
at is the server's choice (vLLM: the raw model distribution by default); train on them only
with `TrainerConfig.old_logprobs='recompute'` unless the server documents the same convention
as `TorchPolicy`.

Failures: the `openai` client retries connection errors, timeouts, 429 and 5xx responses
(`max_retries`, exponential backoff with jitter, each attempt bounded by `timeout_s`); when they
are exhausted for every request of a call -- a server down, a server erroring -- `generate` raises
`PolicyError`: the backend failed, and no empty completion is ever returned in its place to be
scored 0. When only some requests fail, the others' completions are kept and each failed one
comes back as its own `Completion(finish_reason='error')` (the engine retries just those). A request
the server rejects as malformed (400/422: prompt too long, say) comes back as that one request's
`Completion(finish_reason='error', error=...)`.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

from posttrain.policies.base import PolicyError
from posttrain.policies.render import plain_text, render_ids, render_text
from posttrain.values.generation import Completion, GenerationRequest, PolicyVersion
from posttrain.values.image import to_openai

_CONTEXT_ERROR = re.compile(r"context length|context window|maximum context|prompt is too long|"
                            r"longer than the model", re.IGNORECASE)
"""how vLLM, SGLang and OpenAI word a request whose prompt does not fit the model's context"""


@dataclass(frozen=True)
class OpenAIConfig:
    base_url: str
    """the server's API root, e.g. 'http://127.0.0.1:8000/v1'"""
    model: str
    """model name as the server knows it"""
    api: Literal["completions", "chat"] = "completions"
    """'completions' renders messages locally and sends a prompt; 'chat' sends the messages"""
    api_key: str = "EMPTY"
    """sent as the bearer token (local servers ignore it)"""
    timeout_s: float = 120.0
    """bound on one HTTP attempt"""
    max_retries: int = 2
    """retries of a failed attempt (connection error, timeout, 429, 5xx) before PolicyError"""
    max_concurrency: int = 16
    """requests in flight at once (one HTTP request per GenerationRequest)"""
    return_token_ids: bool = True
    """ask for token ids (vLLM's `return_token_ids`); turn off for servers that reject it"""
    logprobs: bool = True
    """ask for the sampled tokens' log-probs"""

    def __post_init__(self) -> None:
        if self.api not in ("completions", "chat"):
            raise ValueError(f"OpenAIConfig.api must be 'completions' or 'chat', got {self.api!r}")
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"OpenAIConfig.base_url must be an http(s) URL, got {self.base_url!r}")
        if not self.model:
            raise ValueError("OpenAIConfig.model must name the served model")
        if self.timeout_s <= 0:
            raise ValueError(f"OpenAIConfig.timeout_s must be > 0, got {self.timeout_s}")
        if self.max_retries < 0:
            raise ValueError(f"OpenAIConfig.max_retries must be >= 0, got {self.max_retries}")
        if self.max_concurrency < 1:
            raise ValueError(f"OpenAIConfig.max_concurrency must be >= 1, got {self.max_concurrency}")


def _extra(obj: Any, key: str) -> Any:
    """A field outside the OpenAI schema (vLLM's token ids), as the client keeps it."""
    value = getattr(obj, key, None)
    if value is None and getattr(obj, "model_extra", None):
        value = obj.model_extra.get(key)
    return value


class OpenAIPolicy:
    def __init__(self, config: OpenAIConfig, *, tokenizer: Any = None,
                 version: PolicyVersion | None = None) -> None:
        import openai

        self.config = config
        self.tokenizer = tokenizer
        if version is None:
            # the tokenizer's identity goes into every trajectory; a server's own tokenizer is
            # unknown here (recorded as '') unless the same one is given to render prompts
            thash = ""
            if tokenizer is not None:
                from posttrain.policies.local import tokenizer_hash

                thash = tokenizer_hash(tokenizer)
            version = PolicyVersion(name=config.model, tokenizer_hash=thash)
        self.version = version
        self.max_positions: int | None = None
        """the server checks its own context (and says so per completion)"""
        self.accepts_images = config.api == "chat"
        """chat sends image parts (data URIs); a completions prompt is text only"""
        self._openai = openai
        self.client = openai.OpenAI(base_url=config.base_url, api_key=config.api_key,
                                    timeout=config.timeout_s, max_retries=config.max_retries)

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        if not requests:
            return []
        workers = min(self.config.max_concurrency, len(requests))
        with ThreadPoolExecutor(max_workers=workers) as pool:
            outs = list(pool.map(self._one_or_error, requests))
        failed = [o for o in outs if isinstance(o, PolicyError)]
        if len(failed) == len(outs):
            raise failed[0]
        return [Completion(text="", finish_reason="error", error=str(o)) if isinstance(o, PolicyError) else o
                for o in outs]

    def _one_or_error(self, request: GenerationRequest) -> Completion | PolicyError:
        try:
            return self._one(request)
        except PolicyError as e:
            return e

    def render(self, request: GenerationRequest) -> list[int] | None:
        return render_ids(self.tokenizer, request.messages) if self.tokenizer is not None else None

    def _prompt(self, request: GenerationRequest) -> str:
        if self.tokenizer is not None:
            return render_text(self.tokenizer, request.messages)
        return plain_text(request.messages)

    def complete(self, request: GenerationRequest) -> Completion:
        """One request, on the calling thread (`generate` runs these concurrently)."""
        return self._one(request)

    def _one(self, request: GenerationRequest) -> Completion:
        cfg, s = self.config, request.sampling
        args: dict[str, Any] = {"model": cfg.model, "max_tokens": s.max_tokens, "temperature": s.temperature,
                                "top_p": s.top_p}
        if s.stop:
            args["stop"] = list(s.stop)
        if s.seed is not None:
            args["seed"] = s.seed
        if cfg.return_token_ids:
            args["extra_body"] = {"return_token_ids": True}
        t0 = time.perf_counter()
        try:
            if cfg.api == "completions":
                response = self.client.completions.create(
                    prompt=self._prompt(request), logprobs=1 if cfg.logprobs else None, **args)
            else:
                messages: list[Any] = [{"role": m.role, "content": to_openai(m.content)} for m in request.messages]
                response = self.client.chat.completions.create(
                    messages=messages,
                    logprobs=cfg.logprobs or None, **args)
        except (self._openai.BadRequestError, self._openai.UnprocessableEntityError) as e:
            return Completion(text="", finish_reason="error", gen_s=time.perf_counter() - t0,
                              error=f"{type(e).__name__}: {e}",
                              context_exceeded=bool(_CONTEXT_ERROR.search(str(e))))
        except self._openai.OpenAIError as e:  # down, timing out, erroring, misconfigured
            raise PolicyError(f"OpenAI-compatible server {cfg.base_url} ({cfg.model}) failed after "
                              f"{cfg.max_retries} retries: {type(e).__name__}: {e}") from e
        if not response.choices:
            raise PolicyError(f"{cfg.base_url}: a response without choices")
        completion = self._completion(response.choices[0], time.perf_counter() - t0)
        usage = response.usage
        details = usage.prompt_tokens_details if usage is not None else None
        if details is not None and details.cached_tokens is not None and completion.finish_reason != "error":
            # one choice per request: the server's prefix-cache reuse is this completion's
            # (posttrain's server and vLLM with --enable-prompt-tokens-details report it)
            completion.reused_tokens = details.cached_tokens
            completion.prefill_tokens = usage.prompt_tokens - details.cached_tokens
        return completion

    def _completion(self, choice: Any, gen_s: float) -> Completion:
        if self.config.api == "completions":
            text = choice.text
            lp = choice.logprobs.token_logprobs if choice.logprobs is not None else None
        else:
            text = choice.message.content or ""
            content = choice.logprobs.content if choice.logprobs is not None else None
            lp = [c.logprob for c in content] if content is not None else None
        token_ids, prompt_ids = _extra(choice, "token_ids"), _extra(choice, "prompt_token_ids")
        if lp is not None and token_ids is not None and len(lp) != len(token_ids):
            lp = None  # misaligned (servers differ on stop-string trimming): unusable for training
        if lp is not None and not all(isinstance(x, (int, float)) and math.isfinite(x) for x in lp):
            # a token the server gave no log-prob (null) or -inf/nan: the trainer's ratio against it
            # would be inf or nan, so none of them is kept and the trainer recomputes the old ones
            lp = None
        reason = choice.finish_reason
        if reason not in ("stop", "length", "tool_calls", "function_call", "content_filter"):
            return Completion(text=text, finish_reason="error", gen_s=gen_s,
                              error=f"the server ended the completion with finish_reason {reason!r}")
        return Completion(text=text, finish_reason="length" if reason == "length" else "stop",
                          prompt_token_ids=prompt_ids,
                          token_ids=token_ids, logprobs=[float(x) for x in lp] if lp is not None else None,
                          gen_s=gen_s)
