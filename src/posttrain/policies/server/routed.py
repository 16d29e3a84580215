"""`ServedPolicy`: generation on one or more inference servers while a trainer updates them.

    policy = ServedPolicy.from_spec("openai:http://127.0.0.1:8000/v1,http://127.0.0.1:8001/v1#tiny-base",
                                    tokenizer=trainer.tokenizer)

* **routing** -- an episode's requests stay on one server (sticky by `meta['episode']`, so its
  next turn finds its earlier turns in that server's prefix cache); a new episode goes to the
  server with the fewest requests in flight (least-loaded first).
* **versions** -- `served` is the policy version every server serves now, set by the weight
  sync (`posttrain.training.sync`) once every server has the new weights. Each episode's first
  request records the version it was sent under (`first_version`): that is the oldest weights
  any of its tokens can come from (a later turn may run on newer ones), which is what its
  staleness is counted from, and what the trajectory records.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from posttrain.policies.openai_compat import OpenAIConfig, OpenAIPolicy
from posttrain.values.generation import Completion, GenerationRequest, PolicyVersion


def parse_engine(spec: str) -> tuple[list[str], str]:
    """'openai:URL[,URL...]#MODEL' -> (base URLs, model name), or ValueError naming the spec."""
    if not spec.startswith("openai:") or "#" not in spec:
        raise ValueError(f"rollout.engine {spec!r}: expected 'local' or 'openai:URL[,URL...]#MODEL'")
    urls, model = spec[len("openai:"):].rsplit("#", 1)
    parsed = [u.strip().rstrip("/") for u in urls.split(",") if u.strip()]
    if not parsed or not model:
        raise ValueError(f"rollout.engine {spec!r}: expected 'openai:URL[,URL...]#MODEL'")
    for u in parsed:
        if not u.startswith(("http://", "https://")):
            raise ValueError(f"rollout.engine {spec!r}: {u!r} is not an http(s) URL")
    return parsed, model


class ServedPolicy:
    def __init__(self, urls: Sequence[str], model: str, *, tokenizer: Any = None,
                 version: PolicyVersion | None = None, max_concurrency: int = 64,
                 timeout_s: float = 300.0, max_retries: int = 2) -> None:
        if not urls:
            raise ValueError("ServedPolicy needs at least one server URL")
        self.urls = list(urls)
        self.servers = [OpenAIPolicy(OpenAIConfig(base_url=u, model=model, timeout_s=timeout_s,
                                                  max_retries=max_retries, max_concurrency=max_concurrency),
                                     tokenizer=tokenizer) for u in self.urls]
        self.tokenizer = tokenizer
        self.version = version or PolicyVersion(name=model)
        """the version every server serves now (the sync sets it)"""
        self.max_positions: int | None = None
        self.max_concurrency = max_concurrency
        self._lock = threading.Lock()
        self._in_flight = [0] * len(self.servers)
        self._sticky: dict[str, int] = {}
        self.first_version: dict[str, str] = {}
        """episode id -> the version served when its first request was sent"""
        self.requests_per_server = [0] * len(self.servers)

    @classmethod
    def from_spec(cls, spec: str, **kwargs: Any) -> ServedPolicy:
        urls, model = parse_engine(spec)
        return cls(urls, model, **kwargs)

    @property
    def roots(self) -> list[str]:
        """Each server's root URL (the weight-update routes live there, not under /v1)."""
        return [u[:-3] if u.endswith("/v1") else u for u in self.urls]

    def render(self, request: GenerationRequest) -> list[int] | None:
        return self.servers[0].render(request)

    def set_version(self, version: PolicyVersion) -> None:
        with self._lock:
            self.version = version

    def pop_first_version(self, episode: str) -> str | None:
        """The version an episode's first request was sent under (forgotten once read)."""
        with self._lock:
            self._sticky.pop(episode, None)
            return self.first_version.pop(episode, None)

    def _route(self, request: GenerationRequest) -> int:
        episode = str(request.meta.get("episode") or request.request_id or "")
        with self._lock:
            index = self._sticky.get(episode) if episode else None
            if index is None:
                index = min(range(len(self.servers)), key=lambda i: (self._in_flight[i], i))
                if episode:
                    self._sticky[episode] = index
            if episode and episode not in self.first_version:
                self.first_version[episode] = self.version.name
            self._in_flight[index] += 1
            self.requests_per_server[index] += 1
            return index

    def _one(self, request: GenerationRequest) -> Completion:
        index = self._route(request)
        try:
            return self.servers[index].complete(request)
        finally:
            with self._lock:
                self._in_flight[index] -= 1

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        if not requests:
            return []
        workers = min(self.max_concurrency * len(self.servers), len(requests))
        with ThreadPoolExecutor(max_workers=workers) as pool:
            return list(pool.map(self._one, requests))
