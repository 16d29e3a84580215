"""Where episodes run: the worker-backend contract and the local (thread pool) backend.

A backend hosts episode drivers and runs their blocking calls (`start`, `advance`, `result`) off
the event loop, returning each call's own duration (measured where it ran, so time spent queued
for a worker is not billed as sandbox time). The Ray backend (`posttrain.scheduling.ray_backend`)
implements the same contract with actors.

Why threads locally: an episode's blocking time is spent waiting on sandbox processes (bwrap,
subprocess pipes) and on I/O, which release the GIL, so threads overlap them at a dispatch cost of
tens of microseconds; a driver also holds live state (its sandbox, its conversation) that cannot
hop between processes per call. Where CPU-bound Python dominates a step (a heavy in-process
verifier), threads serialise on the GIL: run those domains on the Ray backend, whose actors are
separate processes (`benchmarks/scheduler.py` measures both dispatch costs).
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from posttrain.scheduling.work import EpisodeDriver, EpisodeFactory, EpisodeSpec
from posttrain.values.episode import EpisodeResult
from posttrain.values.generation import Completion, GenerationRequest

Step = tuple[GenerationRequest | None, EpisodeResult | None, float]
"""(the next request, or None and the finished episode's result; seconds the call took on its worker)"""


class WorkerBackend(Protocol):
    """Runs episode drivers. A call that ends the episode also fetches its `result()`, so an
    episode of T turns costs T + 1 worker hand-offs, not T + 2."""

    name: str
    capacity: int
    """episode calls that can run at once"""
    busy_s: float
    """summed duration of finished calls (for worker utilisation)"""

    def open(self) -> None: ...

    async def start(self, spec: EpisodeSpec, inline: bool = False) -> tuple[Any, Step]:
        """Build the driver on a worker and start it: (handle, step). `inline`: the episode's
        steps are short in-process Python (`DomainSpec.light`); a backend may run them on the
        calling thread instead of handing them to a worker."""
        ...

    async def advance(self, handle: Any, completion: Completion, inline: bool = False) -> Step: ...

    def discard(self, handle: Any) -> None:
        """Forget an episode that will not be finished (timed out, or its call raised)."""
        ...

    async def close(self) -> None: ...


class LocalBackend:
    """Episodes on a thread pool of this process."""

    name = "local"

    def __init__(self, factory: EpisodeFactory, workers: int = 32) -> None:
        if workers < 1:
            raise ValueError(f"LocalBackend.workers must be >= 1, got {workers}")
        self.factory = factory
        self.capacity = workers
        self.busy_s = 0.0
        self._pool: ThreadPoolExecutor | None = None

    def open(self) -> None:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self.capacity, thread_name_prefix="posttrain-episode")

    async def _run(self, fn: Any, *args: Any) -> Any:
        if self._pool is None:
            raise RuntimeError("LocalBackend is not open")
        out = await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)
        self.busy_s += out[-1]
        return out

    async def start(self, spec: EpisodeSpec, inline: bool = False) -> tuple[Any, Step]:
        if inline:
            return self.start_inline(spec)
        driver, request, traj, secs = await self._run(start_episode, self.factory, spec)
        return driver, (request, traj, secs)

    async def advance(self, handle: EpisodeDriver, completion: Completion, inline: bool = False) -> Step:
        if inline:
            return self.advance_inline(handle, completion)
        return await self._run(advance_episode, handle, completion)

    # The GIL would serialise a light episode's steps on a worker thread anyway; the hand-off to
    # the thread and back costs more than the step itself. The scheduler calls these directly
    # for light episodes (no coroutine at all), `start`/`advance` with `inline` otherwise.
    def start_inline(self, spec: EpisodeSpec) -> tuple[EpisodeDriver, Step]:
        """`start(spec, inline=True)` on the calling thread, synchronously."""
        driver, request, traj, secs = start_episode(self.factory, spec)
        self.busy_s += secs
        return driver, (request, traj, secs)

    def advance_inline(self, handle: EpisodeDriver, completion: Completion) -> Step:
        """`advance(handle, completion, inline=True)` on the calling thread, synchronously."""
        out = advance_episode(handle, completion)
        self.busy_s += out[-1]
        return out

    def discard(self, handle: Any) -> None:
        # A local driver is garbage once unreferenced; one whose call is still running in a
        # thread finishes (or hits its own sandbox limits) there and its result is ignored.
        return None

    async def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


def start_episode(factory: EpisodeFactory, spec: EpisodeSpec
                  ) -> tuple[EpisodeDriver, GenerationRequest | None, EpisodeResult | None, float]:
    """Build and start a driver on the calling worker (and fetch its result if it ended at once)."""
    t0 = time.perf_counter()
    driver = factory(spec)
    request = driver.start()
    traj = driver.result() if request is None else None
    return driver, request, traj, time.perf_counter() - t0


def advance_episode(driver: EpisodeDriver, completion: Completion) -> Step:
    t0 = time.perf_counter()
    request = driver.advance(completion)
    traj = driver.result() if request is None else None
    return request, traj, time.perf_counter() - t0
