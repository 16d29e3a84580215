"""The HTTP face of `BatchEngine`: OpenAI-compatible generation and vLLM's weight-update routes.

* `GET  /v1/models`, `GET /health`
* `POST /v1/completions`       prompt (a string, a list of strings, a list of token ids or a list
                                of such lists), max_tokens, temperature, top_p, n, stop, seed,
                                ignore_eos (vLLM's: decode up to max_tokens), logprobs (any
                                int: the sampled token's log-prob; no alternatives),
                                return_token_ids (vLLM's extension:
                                `token_ids` and `prompt_token_ids` on each choice)
* `POST /v1/chat/completions`  messages, max_tokens / max_completion_tokens, temperature, top_p,
                                n, stop, seed, logprobs (bool), return_token_ids
* `POST /pause?mode=keep|wait`, `POST /resume`, `GET /is_paused`,
  `POST /collective_rpc {"method": "reload_weights", "kwargs": {"weights_path": DIR}}`,
  `POST /reset_prefix_cache` -- the routes vLLM serves with `VLLM_SERVER_DEV_MODE=1`, with the
  same meaning, so one client (`posttrain.training.sync`) updates either server.

Every request is its own rows in the engine's running batch (continuous batching); `n` and a
list of prompts are rows of one request. `usage` adds, per response, the prompt tokens whose
keys/values came from the prefix cache (`prompt_tokens_details.cached_tokens`, as OpenAI and vLLM
name them, and `reused_tokens`) and those computed (`prefill_tokens`), summed over its rows.
Fields this server cannot honour (`best_of`, `echo`, penalties, streaming, tools) are refused
with 400, never ignored.

Images: chat content may be a list of `text` and `image_url` parts (base64 data URIs). A server
of a `VisionPolicy` (`build_app(None, name, vision=batcher)`, a `VisionBatcher`) answers chat
requests with it, images or not: every connection's requests waiting at once are decoded in one
batch (not the continuous batch; no raw completions, the weight routes between two batches); a
text model's server refuses an image part with 400 naming the message and the part.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any, cast

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from posttrain.policies.base import PolicyError
from posttrain.policies.render import render_ids
from posttrain.policies.server.engine import BatchEngine
from posttrain.policies.server.vision_batch import VisionBatcher
from posttrain.values.generation import Completion, GenerationRequest, Message, SamplingParams
from posttrain.values.image import ImagePart, content_text, from_openai

ROLES = ("system", "user", "assistant", "tool")

_REFUSED: dict[str, tuple[Any, ...]] = {
    "best_of": (None, 1), "echo": (None, False), "suffix": (None,), "stream": (None, False),
    "frequency_penalty": (None, 0), "presence_penalty": (None, 0), "logit_bias": (None, {}),
    "tools": (None, []), "response_format": (None,)}
"""fields this server cannot honour -> the values that mean "not used" (anything else is a 400)"""


class RequestError(ValueError):
    """A bad request (HTTP 400), with a message naming the offending field."""


def _sampling(body: dict[str, Any], default_max: int) -> SamplingParams:
    for key, unused in _REFUSED.items():
        if body.get(key) not in unused:
            raise RequestError(f"field {key!r} = {body[key]!r} is not supported by this server")
    stop = body.get("stop") or ()
    stop = (stop,) if isinstance(stop, str) else tuple(stop)
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or default_max
    try:
        return SamplingParams(temperature=float(body.get("temperature", 1.0)),
                              top_p=float(body.get("top_p", 1.0)), max_tokens=int(max_tokens),
                              stop=stop, seed=body.get("seed"))
    except (TypeError, ValueError) as e:
        raise RequestError(str(e)) from e


def _n(body: dict[str, Any]) -> int:
    n = body.get("n", 1)
    if not isinstance(n, int) or not 1 <= n <= 128:
        raise RequestError(f"field 'n' must be an integer in 1..128, got {n!r}")
    return n


def _prompts(engine: BatchEngine, prompt: Any) -> list[list[int]]:
    """The completions API's `prompt`, as token ids: text is tokenised, token ids pass."""
    def is_ids(x: Any) -> bool:
        return isinstance(x, list) and bool(x) and all(isinstance(i, int) and not isinstance(i, bool) for i in x)

    if isinstance(prompt, str):
        return [list(engine.tokenizer(prompt)["input_ids"])]
    if is_ids(prompt):
        return [list(prompt)]
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) or is_ids(p) for p in prompt):
        return [list(engine.tokenizer(p)["input_ids"]) if isinstance(p, str) else list(p) for p in prompt]
    raise RequestError("field 'prompt' must be a string, a list of token ids, or a non-empty list of those")


def _messages(raw: Any) -> tuple[Message, ...]:
    """The chat `messages`, their content parsed (text, or text and image parts)."""
    if not isinstance(raw, list) or not raw:
        raise RequestError("field 'messages' must be a non-empty list of {role, content} objects")
    out = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict) or "content" not in m or m.get("role") not in ROLES:
            raise RequestError(f"messages[{i}] must be a {{role, content}} object with role one of {ROLES}")
        try:
            out.append(Message(m["role"], from_openai(m["content"])))
        except ValueError as e:
            raise RequestError(f"messages[{i}].content: {e}") from e
    return tuple(out)


def _text_only(messages: tuple[Message, ...], model_name: str) -> tuple[Message, ...]:
    """`messages` as plain text, or a 400 naming the first image part (a text model cannot read it)."""
    for i, m in enumerate(messages):
        if not isinstance(m.content, str):
            for j, part in enumerate(m.content):
                if isinstance(part, ImagePart):
                    raise RequestError(f"messages[{i}].content part {j} is an image_url part, but the served "
                                       f"model {model_name!r} reads text only (serve a vision model for images)")
    return tuple(Message(m.role, content_text(m.content)) for m in messages)


def build_app(engine: BatchEngine | None, model_name: str, vision: VisionBatcher | None = None) -> Starlette:
    """The app of a text model's `engine`, or (engine None) of a vision policy's batcher."""
    if (engine is None) == (vision is None):
        raise ValueError("build_app: give a BatchEngine or a VisionBatcher (one of them)")
    tokenizer = engine.tokenizer if engine is not None else cast(VisionBatcher, vision).policy.tokenizer
    # the weight routes: the continuous batch's engine, or the vision batcher (same methods)
    live = cast(BatchEngine, engine if engine is not None else vision)

    async def run(prompts: list[list[int]], sampling: SamplingParams, n: int,
                  ignore_eos: bool = False) -> list[Completion]:
        assert engine is not None
        vocab = cast(Any, engine.model).get_input_embeddings().weight.shape[0]
        for p in prompts:
            bad = [i for i in p if not 0 <= i < vocab]
            if bad:
                raise RequestError(f"field 'prompt': token id {bad[0]} is outside the vocabulary (0..{vocab - 1})")
        futures = [asyncio.wrap_future(engine.submit(p, sampling, ignore_eos)) for p in prompts for _ in range(n)]
        out = await asyncio.gather(*futures)
        for c in out:
            if c.finish_reason == "error":  # the prompt does not fit: the client's fault
                raise RequestError(c.error or "generation failed")
        return out

    def token_text(ids: list[int]) -> list[str]:
        return [tokenizer.decode([i]) for i in ids]

    def envelope(kind: str, choices: list[dict], prompts: list[list[int]], outs: list[Completion]) -> dict:
        completion_tokens = sum(len(c.token_ids or []) for c in outs)
        prompt_tokens = sum(map(len, prompts))
        reused = sum(c.reused_tokens for c in outs)
        # per row computed: a prompt shared by n rows is prefilled once, yet counted per row here
        prefill = sum(c.prefill_tokens for c in outs)
        return {"id": f"cmpl-{uuid.uuid4().hex}", "object": kind, "created": int(time.time()),
                "model": model_name, "choices": choices,
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                          "total_tokens": prompt_tokens + completion_tokens,
                          "prompt_tokens_details": {"cached_tokens": reused},  # OpenAI's and vLLM's name
                          "prefill_tokens": prefill, "reused_tokens": reused}}

    async def completions(body: dict[str, Any]) -> dict[str, Any]:
        assert engine is not None
        prompts = _prompts(engine, body.get("prompt"))
        sampling, n = _sampling(body, default_max=16), _n(body)
        outs = await run(prompts, sampling, n, bool(body.get("ignore_eos")))
        choices = []
        for i, c in enumerate(outs):
            choice: dict[str, Any] = {"index": i, "text": c.text, "finish_reason": c.finish_reason,
                                      "logprobs": None}
            if body.get("logprobs") is not None:
                choice["logprobs"] = {"tokens": token_text(c.token_ids or []), "token_logprobs": c.logprobs,
                                      "top_logprobs": None, "text_offset": None}
            if body.get("return_token_ids"):
                choice.update(token_ids=c.token_ids, prompt_token_ids=c.prompt_token_ids)
            choices.append(choice)
        return envelope("text_completion", choices, prompts, outs)

    async def chat(body: dict[str, Any]) -> dict[str, Any]:
        messages = _messages(body.get("messages"))
        sampling, n = _sampling(body, default_max=64), _n(body)
        if vision is not None:
            outs = await asyncio.wrap_future(vision.start().submit([GenerationRequest(messages, sampling)] * n))
            for c in outs:
                if c.finish_reason == "error":
                    raise RequestError(c.error or "generation failed")
            prompts = [list(outs[0].prompt_token_ids or [])]
        else:
            assert engine is not None
            prompts = [render_ids(engine.tokenizer, _text_only(messages, model_name))]
            outs = await run(prompts, sampling, n)
        choices = []
        for i, c in enumerate(outs):
            choice: dict[str, Any] = {"index": i, "message": {"role": "assistant", "content": c.text},
                                      "finish_reason": c.finish_reason, "logprobs": None}
            if body.get("logprobs"):
                choice["logprobs"] = {"content": [
                    {"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []}
                    for t, lp in zip(token_text(c.token_ids or []), c.logprobs or [])]}
            if body.get("return_token_ids"):
                choice.update(token_ids=c.token_ids, prompt_token_ids=c.prompt_token_ids)
            choices.append(choice)
        return envelope("chat.completion", choices, prompts, outs)

    def error(status: int, message: str, kind: str) -> JSONResponse:
        return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status_code=status)

    def generation(handler: Any) -> Any:
        async def endpoint(request: Request) -> JSONResponse:
            try:
                body = await request.json()
            except ValueError:
                return error(400, "the request body is not valid JSON", "invalid_request_error")
            if not isinstance(body, dict):
                return error(400, "the request body must be a JSON object", "invalid_request_error")
            try:
                return JSONResponse(await handler(body))
            except RequestError as e:
                return error(400, str(e), "invalid_request_error")
            except PolicyError as e:
                return error(500, str(e), "server_error")
        return endpoint

    async def models(request: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [
            {"id": model_name, "object": "model", "owned_by": "posttrain",
             "weights_path": engine.weights_path if engine is not None else
             (vision.weights_path or (str(vision.policy.path) if vision.policy.path else None)
              if vision is not None else None)}]})

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"ok": True})

    async def pause(request: Request) -> JSONResponse:
        mode = request.query_params.get("mode", "keep")
        if mode not in ("keep", "wait"):
            return error(400, f"query 'mode' must be 'keep' or 'wait', got {mode!r}", "invalid_request_error")
        await asyncio.to_thread(live.pause, mode)
        return JSONResponse({"status": "paused", "mode": mode})

    async def resume(request: Request) -> JSONResponse:
        live.resume()
        return JSONResponse({"status": "resumed"})

    async def is_paused(request: Request) -> JSONResponse:
        return JSONResponse({"is_paused": live.paused})

    async def reset_prefix_cache(request: Request) -> JSONResponse:
        await asyncio.to_thread(live.reset_prefix_cache)
        return JSONResponse({"status": "ok"})

    async def collective_rpc(request: Request) -> JSONResponse:
        try:
            body = await request.json()
        except ValueError:
            return error(400, "the request body is not valid JSON", "invalid_request_error")
        method = body.get("method") if isinstance(body, dict) else None
        kwargs = (body.get("kwargs") or {}) if isinstance(body, dict) else {}
        if method != "reload_weights":
            return error(400, f"field 'method' = {method!r}: this server supports 'reload_weights' only",
                         "invalid_request_error")
        path = kwargs.get("weights_path") if isinstance(kwargs, dict) else None
        if not isinstance(path, str) or not path:
            return error(400, "field 'kwargs.weights_path' must name a directory of safetensors",
                         "invalid_request_error")
        try:
            n = await asyncio.to_thread(live.reload_weights, path)
        except (OSError, ValueError) as e:
            return error(400, f"reload_weights: {e}", "invalid_request_error")
        return JSONResponse({"results": [{"tensors": n, "weights_path": path}]})

    routes = [Route("/v1/models", models, methods=["GET"]), Route("/health", health, methods=["GET"]),
              Route("/v1/chat/completions", generation(chat), methods=["POST"])]
    weight_routes = [Route("/pause", pause, methods=["POST"]), Route("/resume", resume, methods=["POST"]),
                     Route("/is_paused", is_paused, methods=["GET"]),
                     Route("/reset_prefix_cache", reset_prefix_cache, methods=["POST"]),
                     Route("/collective_rpc", collective_rpc, methods=["POST"])]
    if engine is None:  # a vision policy: chat only (no raw prompts: they would need their images)
        async def chat_only(request: Request) -> JSONResponse:
            return error(400, f"{request.url.path}: the served model {model_name!r} is a vision model, which "
                              "this server answers through /v1/chat/completions only", "invalid_request_error")

        return Starlette(routes=[*routes, *weight_routes, Route("/v1/completions", chat_only, methods=["POST"])])
    return Starlette(routes=[*routes, Route("/v1/completions", generation(completions), methods=["POST"]),
                             *weight_routes])
