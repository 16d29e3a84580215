"""Continuous batching of generation requests from every running episode into the policy.

Each running episode awaits `generate(request)`; the batcher collects pending requests and issues
one `Policy.generate` call per batch: as soon as a call slot is free it takes up to `max_batch`
requests, waiting at most `max_wait_s` after the oldest request's arrival for more to join.
Requests that arrive while a call is running simply wait for the next one, so a busy generator
goes from one full batch to the next without a gap. `generate` runs on its own thread(s): it
blocks (a local model computes, a server is waited on) and must not stall the event loop.

A `generate` call that raises is retried as a whole batch with backoff; if it keeps failing, every
request of the batch gets an error completion, which the episode records as `infra_error` with
`where='policy'` (not held against the domain's health).

What this does not do: interleave token-level decoding across calls (that is the backend's
continuous batching, vLLM's or SGLang's), or order requests by anything but arrival.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from posttrain.policies.base import Completion, GenerationRequest, Policy, PolicyError
from posttrain.scheduling.config import BatchConfig


class GenerationBatcher:
    def __init__(self, policy: Policy, config: BatchConfig = BatchConfig()) -> None:
        self.policy, self.config = policy, config
        self._pending: list[tuple[GenerationRequest, asyncio.Future, float]] = []
        self._arrived: asyncio.Event | None = None
        self._slots: asyncio.Semaphore | None = None
        self._task: asyncio.Task | None = None
        self._calls: set[asyncio.Task] = set()
        self._pool: ThreadPoolExecutor | None = None
        self._covered_until = 0.0
        self.busy_s = 0.0
        """seconds during which at least one `generate` call was running"""
        self.calls = 0
        self.requests = 0
        self.tokens = 0
        self.failed_calls = 0
        self.failed_requests = 0

    # -- lifecycle --------------------------------------------------------------------
    def start(self) -> None:
        if self._task is not None:
            raise RuntimeError("batcher already started")
        self._arrived = asyncio.Event()
        self._slots = asyncio.Semaphore(self.config.max_inflight)
        self._pool = ThreadPoolExecutor(max_workers=self.config.max_inflight,
                                        thread_name_prefix="posttrain-generate")
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="generation-batcher")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        for t in list(self._calls):
            t.cancel()
        await asyncio.gather(*self._calls, return_exceptions=True)
        for _, fut, _ in self._pending:
            if not fut.done():
                fut.cancel()
        self._pending.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    # -- the episodes' side -----------------------------------------------------------
    async def generate(self, request: GenerationRequest) -> tuple[Completion, float, int]:
        """One completion, with the generator seconds and tokens attributed to it."""
        if self._task is None:
            raise RuntimeError("batcher not started")
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        self._pending.append((request, fut, time.perf_counter()))
        self._arrived.set()
        return await fut

    def busy_seconds(self) -> float:
        """Seconds inside `generate` calls that have returned (a running call counts when done)."""
        return self.busy_s

    # -- internals --------------------------------------------------------------------
    async def _loop(self) -> None:
        cfg = self.config
        while True:
            while not self._pending:
                self._arrived.clear()
                await self._arrived.wait()
            await self._slots.acquire()
            # Fill the batch: up to max_batch, or until the oldest request has waited max_wait_s.
            while len(self._pending) < cfg.max_batch:
                remaining = self._pending[0][2] + cfg.max_wait_s - time.perf_counter()
                if remaining <= 0:
                    break
                self._arrived.clear()
                try:
                    await asyncio.wait_for(self._arrived.wait(), remaining)
                except asyncio.TimeoutError:
                    break
            batch = self._pending[:cfg.max_batch]
            del self._pending[:cfg.max_batch]
            task = asyncio.get_running_loop().create_task(self._call(batch))
            self._calls.add(task)
            task.add_done_callback(self._calls.discard)

    async def _call(self, batch: list[tuple[GenerationRequest, asyncio.Future, float]]) -> None:
        loop = asyncio.get_running_loop()
        requests = [r for r, _, _ in batch]
        try:
            completions: list[Completion] | None = None
            error: BaseException | None = None
            dt = 0.0
            for attempt in range(self.config.retries + 1):
                if attempt:
                    await asyncio.sleep(self.config.retry_backoff_s * 2 ** (attempt - 1))
                completions, t0, t1, error = await loop.run_in_executor(
                    self._pool, _timed_generate, self.policy, requests)
                self._count_busy(t0, t1)
                dt = t1 - t0
                if error is None:
                    break
                self.failed_calls += 1
            self.calls += 1
            self.requests += len(batch)
            if error is not None or completions is None:
                message = f"{type(error).__name__}: {error}"
                self.failed_requests += len(batch)
                for _, fut, _ in batch:
                    if not fut.done():
                        fut.set_result((Completion(text="", finish_reason="error", error=message), 0.0, 0))
                return
            counts = [_tokens(c) for c in completions]
            total = sum(counts) or len(counts)
            self.tokens += sum(counts)
            for (_, fut, _), c, n in zip(batch, completions, counts):
                if not fut.done():
                    fut.set_result((c, dt * (n or 1) / total, n))
        finally:
            self._slots.release()

    def _count_busy(self, t0: float, t1: float) -> None:
        # The union of call intervals (measured inside the generate thread, so thread hand-off
        # latency counts as idle): exact for one call at a time, close for several.
        self.busy_s += max(0.0, t1 - max(t0, self._covered_until))
        self._covered_until = max(self._covered_until, t1)

    def metrics(self) -> dict[str, Any]:
        return {"calls": self.calls, "requests": self.requests, "tokens": self.tokens,
                "mean_batch": round(self.requests / self.calls, 3) if self.calls else None,
                "failed_calls": self.failed_calls, "failed_requests": self.failed_requests,
                "busy_s": round(self.busy_seconds(), 6)}


def _timed_generate(policy: Policy, requests: list[GenerationRequest]
                    ) -> tuple[list[Completion] | None, float, float, BaseException | None]:
    t0 = time.perf_counter()
    try:
        completions = policy.generate(requests)
        if len(completions) != len(requests):
            raise PolicyError(f"policy returned {len(completions)} completions for "
                              f"{len(requests)} requests")
        return completions, t0, time.perf_counter(), None
    except Exception as e:  # noqa: BLE001 - returned, so the caller can count the time and retry
        return None, t0, time.perf_counter(), e


def _tokens(c: Completion) -> int:
    if c.token_ids is not None:
        return len(c.token_ids)
    return max(1, len(c.text) // 4)  # no token ids: a rough 4 characters per token
