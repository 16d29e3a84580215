"""Continuous batching of generation requests from every running episode into the policy.

Each running episode awaits `generate(request)`; requests wait in one queue, and the generator
thread(s) pull batches from it: a thread that is free takes up to `max_batch` requests at once,
waiting `max_wait_s` after the oldest one's arrival for more to join, and longer while the event
loop is still running the episode steps that were ready when the first of them came (a burst:
the episodes of a workload all start in one pass of the loop, which can outlast `max_wait_s`
under load; cutting it would split one turn's requests into several calls of a model whose cost
is per call), and calls `Policy.generate` once for the batch. A thread that returns from a call takes the next batch
itself, straight away, without a round trip through the event loop, so a busy generator goes
from one batch to the next without a gap (a loop busy with hundreds of episodes would otherwise
add milliseconds per call). `generate` blocks (a local model computes, a server is waited on),
which is why it runs on threads of its own; `max_inflight` threads for a server that takes
concurrent calls.

When more requests wait than a batch holds, the scheduler's priority decides: higher tiers, then
older groups (the ones the trainer needs next, so the staleness bound stalls it less).

A failed request fails alone: when a `generate` call returns an error completion for some of its
requests, the others' completions are delivered and only the failed requests are retried (with
backoff, `BatchConfig.retries` times). A call that raises cannot say which request failed, so the
batch is split in halves, each asked once: when one half answers and the other raises, the failure
is that half's, and it is split again until the request that raises stands alone (isolating one bad
request in a batch of n costs about 2·log2(n) extra calls, and the rest of the batch is delivered).
When both halves raise, the failure is not one request's doing (a backend outage, or bad requests
on both sides): that group is retried with backoff, as it was before the split. A request that
still fails gets an error completion, which the episode records as `infra_error` with
`where='policy'` (not held against the domain's health).

What this does not do: interleave token-level decoding across calls (that is the backend's
continuous batching, vLLM's or SGLang's), or split a request across calls.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import threading
import time
from collections import deque
from typing import Any

from posttrain.policies.base import Policy, PolicyError
from posttrain.scheduling.config import BatchConfig
from posttrain.values.generation import Completion, GenerationRequest

_Entry = tuple[Any, int, GenerationRequest, asyncio.Future, float]


class GenerationBatcher:
    def __init__(self, policy: Policy, config: BatchConfig = BatchConfig()) -> None:
        self.policy, self.config = policy, config
        self._pending: list[_Entry] = []
        """a heap of (priority, arrival number, request, future, arrival time)"""
        self._oldest = float("inf")
        """arrival time of the oldest pending request"""
        self._count = itertools.count()
        self._cond = threading.Condition()
        self._threads: list[threading.Thread] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closing = False
        self._burst = False
        """requests are arriving from episode steps the loop is running now (a burst: e.g. a
        thousand episodes started at once); a batch is not cut in the middle of one"""
        self._covered_until = 0.0
        self.intervals: deque[tuple[float, float]] = deque(maxlen=100_000)
        """(start, end) perf_counter times of the latest calls, for utilisation over a time range"""
        self.busy_s = 0.0
        """seconds during which at least one `generate` call was running"""
        self.calls = 0
        self.requests = 0
        self.tokens = 0
        self.failed_calls = 0
        """`generate` calls that raised"""
        self.failed_requests = 0
        """requests delivered with an error completion (after their retries)"""
        self.retried_requests = 0
        """requests sent again after failing (alone, or with their batch when the call raised)"""

    # -- lifecycle --------------------------------------------------------------------
    def start(self) -> None:
        if self._threads:
            raise RuntimeError("batcher already started")
        self._loop = asyncio.get_running_loop()
        self._closing = False
        self._threads = [threading.Thread(target=self._worker, name=f"posttrain-generate-{i}", daemon=True)
                         for i in range(self.config.max_inflight)]
        for t in self._threads:
            t.start()

    async def close(self) -> None:
        """Stop taking batches; pending requests are cancelled. A call in progress finishes on its
        (daemon) thread and its results are dropped."""
        with self._cond:
            self._closing = True
            pending, self._pending = self._pending, []
            self._cond.notify_all()
        for *_, fut, _ in pending:
            if not fut.done():
                fut.cancel()
        self._threads = []

    # -- the episodes' side -----------------------------------------------------------
    async def generate(self, request: GenerationRequest, priority: Any = ()) -> tuple[Completion, float, int]:
        """One completion, with the generator seconds and tokens attributed to it. When more
        requests wait than a batch holds, the lowest `priority` goes first (then arrival)."""
        return await self.submit(request, priority)

    def submit(self, request: GenerationRequest, priority: Any = ()) -> asyncio.Future:
        """`generate` without the coroutine: queue `request` now and return the future that
        `generate` awaits (for a caller that continues in a done-callback instead of a task).
        Call it on the event loop's thread."""
        if not self._threads:
            raise RuntimeError("batcher not started")
        assert self._loop is not None  # set by start(), with the threads
        fut: asyncio.Future = self._loop.create_future()
        now = time.perf_counter()
        with self._cond:
            pending = self._pending
            heapq.heappush(pending, (priority, next(self._count), request, fut, now))
            self._oldest = min(self._oldest, now)
            if not self._burst:
                self._burst = True
                self._loop.call_soon(self._burst_ended)
            # Wake a generator thread only when that changes what it does: the first request
            # (it waits for one) or a full batch (it waits for the batch to fill). Waking it
            # for every arrival cost a GIL hand-off per request, which doubled the engine's
            # cost per episode of a cheap policy.
            if len(pending) == 1 or len(pending) == self.config.max_batch:
                self._cond.notify()
        return fut

    def _burst_ended(self) -> None:
        """The loop has run every episode step that was ready when this burst's first request
        came: what they had to ask is asked."""
        with self._cond:
            self._burst = False
            self._cond.notify()

    def busy_seconds(self) -> float:
        """Seconds inside `generate` calls that have returned (a running call counts when done)."""
        return self.busy_s

    def busy_between(self, start: float, end: float) -> float:
        """Fraction of [start, end] (perf_counter times) spent inside `generate` calls."""
        covered, until = 0.0, start
        for t0, t1 in sorted(self.intervals):
            lo, hi = max(t0, until), min(t1, end)
            if hi > lo:
                covered += hi - lo
                until = hi
        return covered / (end - start) if end > start else 0.0

    # -- the generator threads --------------------------------------------------------
    def _take(self) -> list[_Entry] | None:
        """The next batch (None when closing); waits for requests and for the batch to fill."""
        cfg = self.config
        with self._cond:
            while True:
                while not self._pending and not self._closing:
                    self._cond.wait()
                while not self._closing and 0 < len(self._pending) < cfg.max_batch:
                    remaining = self._oldest + cfg.max_wait_s - time.perf_counter()
                    if remaining <= 0 and not self._burst:
                        break
                    self._cond.wait(remaining if remaining > 0 else None)
                if self._closing:
                    return None
                if self._pending:
                    break
                # another generator thread took them while this one waited: wait anew (the
                # oldest arrival is then no time at all, not a timeout to wait for)
            pending = self._pending
            batch = [heapq.heappop(pending) for _ in range(min(cfg.max_batch, len(pending)))]
            self._oldest = min((e[4] for e in pending), default=float("inf"))
            if pending:
                self._cond.notify()  # what is left is another thread's (arrivals do not wake it)
            return batch

    def _worker(self) -> None:
        while (batch := self._take()) is not None:
            outs = self._generate([e[2] for e in batch])
            try:
                assert self._loop is not None
                self._loop.call_soon_threadsafe(self._deliver, batch, outs)
            except RuntimeError:  # the loop is closed: nobody waits for these any more
                return

    def _generate(self, requests: list[GenerationRequest]) -> list[tuple[Completion, float, int]]:
        """A completion for every request, with its share of generator seconds and its tokens.
        Only what failed is retried: requests whose completion is an error (a prompt that does
        not fit the model is final: a retry cannot help), and requests whose call raised, after
        `_ask` has split the call to find which of them raise."""
        outs: list[list] = [[None, 0.0, 0] for _ in requests]
        errors: dict[int, str] = {}
        todo = list(range(len(requests)))
        for attempt in range(self.config.retries + 1):
            if attempt:
                time.sleep(self.config.retry_backoff_s * 2 ** (attempt - 1))
                self.retried_requests += len(todo)
            todo = self._ask(requests, todo, outs, errors)
            if not todo:
                break
        for i, out in enumerate(outs):
            if out[0] is None:  # every call that carried it raised
                out[0] = Completion(text="", finish_reason="error", error=errors[i])
        return [(c, dt, n) for c, dt, n in outs]

    def _ask(self, requests: list[GenerationRequest], todo: list[int], outs: list[list],
             errors: dict[int, str], raised: bool = False) -> list[int]:
        """One attempt for the requests `todo` (`raised`: a call with exactly these already
        raised); records what came back in `outs` and returns the requests to retry. A call that
        raises is split in halves, each asked once; a half that raises while the other answers
        holds the bad request and is split on, down to one request. When both halves raise, the
        failure is not one request's doing, and the whole group is returned for a retry."""
        if not raised:
            failed = self._call(requests, todo, outs, errors)
            if failed is not None:
                return failed
        if len(todo) == 1:
            return todo
        half = len(todo) // 2
        halves = (todo[:half], todo[half:])
        results = [self._call(requests, h, outs, errors) for h in halves]
        if results[0] is None and results[1] is None:
            return todo
        retry: list[int] = []
        for h, failed in zip(halves, results):
            retry += failed if failed is not None else self._ask(requests, h, outs, errors, raised=True)
        return retry

    def _call(self, requests: list[GenerationRequest], todo: list[int], outs: list[list],
              errors: dict[int, str]) -> list[int] | None:
        """One `generate` call: None when it raised (the error noted for each request), else the
        requests whose completion is a retryable error (the others' are recorded in `outs`)."""
        completions, t0, t1, error = _timed_generate(self.policy, [requests[i] for i in todo])
        self._count_busy(t0, t1)
        if error is not None or completions is None:
            self.failed_calls += 1
            for i in todo:
                errors[i] = f"{type(error).__name__}: {error}"
            return None
        counts = [_tokens(c) for c in completions]
        total = sum(counts) or len(counts)
        failed = []
        for i, c, n in zip(todo, completions, counts):
            out = outs[i]
            out[0], out[1], out[2] = c, out[1] + (t1 - t0) * (n or 1) / total, out[2] + n
            if c.finish_reason == "error" and not c.context_exceeded:
                failed.append(i)
                errors[i] = c.error or ""
        return failed

    def _deliver(self, batch: list[_Entry], outs: list[tuple[Completion, float, int]]) -> None:
        self.calls += 1
        self.requests += len(batch)
        for (*_, fut, _), (c, dt, n) in zip(batch, outs):
            self.tokens += n if c.finish_reason != "error" else 0
            if c.finish_reason == "error":
                self.failed_requests += 1
            if not fut.done():
                fut.set_result((c, dt, n))

    def _count_busy(self, t0: float, t1: float) -> None:
        # The union of call intervals (measured inside the generate thread): exact for one
        # call at a time, close for several.
        with self._cond:
            self.busy_s += max(0.0, t1 - max(t0, self._covered_until))
            self._covered_until = max(self._covered_until, t1)
            self.intervals.append((t0, t1))

    def metrics(self) -> dict[str, Any]:
        return {"calls": self.calls, "requests": self.requests, "tokens": self.tokens,
                "mean_batch": round(self.requests / self.calls, 3) if self.calls else None,
                "failed_calls": self.failed_calls, "failed_requests": self.failed_requests,
                "retried_requests": self.retried_requests,
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
