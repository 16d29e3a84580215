"""Serve a local model over the OpenAI-compatible HTTP API (completions and chat).

    .venv/bin/python -m posttrain.policies.serve --model models/tiny-base --port 8000
    # -> listening on http://127.0.0.1:8000/v1

A small standard-library server (no web framework) in front of a `TorchPolicy`, enough for
`OpenAIPolicy`, the `openai` client and tools that speak this API to use a local model, and for
the tests to exercise `OpenAIPolicy` against a real HTTP server. Endpoints:

* `GET  /v1/models`
* `POST /v1/completions`       prompt (a string or a list of strings), max_tokens, temperature,
                                top_p, n, stop, seed, logprobs (any int: the sampled token's
                                log-prob; no alternatives), return_token_ids (vLLM's extension)
* `POST /v1/chat/completions`  messages, max_tokens / max_completion_tokens, temperature, top_p,
                                n, stop, seed, logprobs (bool), return_token_ids

What it is *not*: a production server. Requests are served one batch at a time (each request's
prompts x n go to the model as one batch), there is no streaming, no authentication, no
`best_of`/`echo`/penalties (refused with 400, not ignored). It binds 127.0.0.1 by default.
Log-probs are those of `TorchPolicy`: temperature-scaled, before top-p.
"""

from __future__ import annotations

import argparse
import json
import socket
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from posttrain.policies.base import PolicyError
from posttrain.policies.local import TorchPolicy
from posttrain.policies.render import render_ids
from posttrain.values.generation import Completion, Message, SamplingParams

_REFUSED: dict[str, tuple[object, ...]] = {
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


class PolicyServer:
    """An HTTP server around one policy; `start()` runs it on a background thread."""

    def __init__(self, policy: TorchPolicy, host: str = "127.0.0.1", port: int = 0,
                 model_name: str | None = None) -> None:
        self.policy = policy
        self.model_name = model_name or policy.version.name
        self.httpd = ThreadingHTTPServer((host, port), self._handler())
        self.httpd.daemon_threads = True
        self._thread: threading.Thread | None = None
        self._conns: set[socket.socket] = set()
        self._conns_lock = threading.Lock()

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    def start(self) -> PolicyServer:
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving and drop open keep-alive connections (clients see the server gone)."""
        self.httpd.shutdown()
        self.httpd.server_close()
        with self._conns_lock:
            for conn in list(self._conns):
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            self._conns.clear()

    # -- the two generation endpoints ---------------------------------------------------
    def _token_text(self, ids: list[int]) -> list[str]:
        return [self.policy.tokenizer.decode([i]) for i in ids]

    def _run(self, prompts: list[list[int]], sampling: SamplingParams, n: int) -> list[Completion]:
        out = self.policy.generate_ids([p for p in prompts for _ in range(n)],
                                       [sampling] * (len(prompts) * n))
        for c in out:
            if c.finish_reason == "error":  # the prompt does not fit: the client's fault
                raise RequestError(c.error or "generation failed")
        return out

    def completions(self, body: dict[str, Any]) -> dict[str, Any]:
        prompt = body.get("prompt")
        prompts = [prompt] if isinstance(prompt, str) else prompt
        if not isinstance(prompts, list) or not prompts or not all(isinstance(p, str) for p in prompts):
            raise RequestError("field 'prompt' must be a string or a non-empty list of strings")
        sampling, n = _sampling(body, default_max=16), _n(body)
        ids = [list(self.policy.tokenizer(p)["input_ids"]) for p in prompts]
        choices = []
        for i, c in enumerate(self._run(ids, sampling, n)):
            choice: dict[str, Any] = {"index": i, "text": c.text, "finish_reason": c.finish_reason,
                                      "logprobs": None}
            if body.get("logprobs") is not None:
                choice["logprobs"] = {"tokens": self._token_text(c.token_ids or []),
                                      "token_logprobs": c.logprobs, "top_logprobs": None,
                                      "text_offset": None}
            if body.get("return_token_ids"):
                choice.update(token_ids=c.token_ids, prompt_token_ids=c.prompt_token_ids)
            choices.append(choice)
        return self._envelope("text_completion", choices, ids, n)

    def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        raw = body.get("messages")
        try:
            messages = tuple(Message(m["role"], m["content"]) for m in raw)  # type: ignore[union-attr]
        except (TypeError, KeyError) as e:
            raise RequestError("field 'messages' must be a list of {role, content} objects") from e
        if not messages or any(m.role not in ("system", "user", "assistant", "tool")
                               or not isinstance(m.content, str) for m in messages):
            raise RequestError("field 'messages' must be non-empty, with known roles and text content")
        sampling, n = _sampling(body, default_max=64), _n(body)
        ids = [render_ids(self.policy.tokenizer, messages)]
        choices = []
        for i, c in enumerate(self._run(ids, sampling, n)):
            choice: dict[str, Any] = {"index": i, "message": {"role": "assistant", "content": c.text},
                                      "finish_reason": c.finish_reason, "logprobs": None}
            if body.get("logprobs"):
                choice["logprobs"] = {"content": [
                    {"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []}
                    for t, lp in zip(self._token_text(c.token_ids or []), c.logprobs or [])]}
            if body.get("return_token_ids"):
                choice.update(token_ids=c.token_ids, prompt_token_ids=c.prompt_token_ids)
            choices.append(choice)
        return self._envelope("chat.completion", choices, ids, n)

    def _envelope(self, kind: str, choices: list[dict], prompts: list[list[int]], n: int) -> dict[str, Any]:
        completion_tokens = sum(len(c.get("token_ids") or []) for c in choices)
        prompt_tokens = sum(map(len, prompts))
        return {"id": f"cmpl-{uuid.uuid4().hex}", "object": kind, "created": int(time.time()),
                "model": self.model_name, "choices": choices,
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                          "total_tokens": prompt_tokens + completion_tokens}}

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # quiet: one line per request is noise
                pass

            def setup(self) -> None:
                super().setup()
                with server._conns_lock:
                    server._conns.add(self.connection)

            def finish(self) -> None:
                with server._conns_lock:
                    server._conns.discard(self.connection)
                super().finish()

            def _send(self, status: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _error(self, status: int, message: str, kind: str) -> None:
                self._send(status, {"error": {"message": message, "type": kind, "code": status}})

            def do_GET(self) -> None:
                if self.path.rstrip("/") == "/v1/models":
                    self._send(200, {"object": "list", "data": [
                        {"id": server.model_name, "object": "model", "owned_by": "posttrain"}]})
                else:
                    self._error(404, f"no route {self.path}", "not_found_error")

            def do_POST(self) -> None:
                routes = {"/v1/completions": server.completions, "/v1/chat/completions": server.chat}
                route = routes.get(self.path.rstrip("/"))
                if route is None:
                    return self._error(404, f"no route {self.path}", "not_found_error")
                try:
                    length = int(self.headers.get("Content-Length") or 0)
                    body = json.loads(self.rfile.read(length) or b"{}")
                    if not isinstance(body, dict):
                        raise RequestError("the request body must be a JSON object")
                    self._send(200, route(body))
                except (RequestError, json.JSONDecodeError) as e:
                    self._error(400, str(e), "invalid_request_error")
                except PolicyError as e:
                    self._error(500, str(e), "server_error")

        return Handler


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Serve a local HF causal LM over the OpenAI API.")
    parser.add_argument("--model", required=True, help="model directory (or trainer checkpoint)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port (0 picks a free one)")
    parser.add_argument("--device", default=None, help="torch device (default: cuda if available)")
    parser.add_argument("--name", default=None, help="model name served (default: its version name)")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    args = parser.parse_args(argv)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    server = PolicyServer(TorchPolicy(args.model, device=args.device), args.host, args.port, args.name)
    print(f"listening on {server.url}", flush=True)
    try:
        server.httpd.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.httpd.server_close()


if __name__ == "__main__":
    main()
