"""`VisionBatcher`: the chat requests of every connection to a served `VisionPolicy`, decoded
together.

A `VisionPolicy` has no continuous batch (rows cannot join a running decode: each prompt pass
takes its rows' images). Called per HTTP request, concurrent clients would queue behind each
other's whole decode, one request at a time. Here each connection submits its requests and waits
on a future; one worker thread takes everything queued (whole submissions, up to `max_batch`
requests; one larger submission goes alone) and decodes it with one `generate` call (one prompt
pass for all rows, then one token per row per step, each row with its own sampling). Requests that
arrive meanwhile form the next batch.

Weight updates (what `posttrain.training.sync` calls on a server): `pause()` takes no new batch
and returns once the batch in flight is done (a decode cannot be paused midway, so 'keep' and
'wait' both wait for it), `reload_weights(dir)` copies a directory's safetensors into the model
between two batches (its prefix cache is emptied), `resume()` takes batches again.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass

from posttrain.policies.server.weights import load_weights_into
from posttrain.policies.vision import VisionPolicy
from posttrain.values.generation import Completion, GenerationRequest


@dataclass
class BatchStats:
    batches: int = 0
    requests: int = 0
    largest: int = 0
    """the most requests one `generate` call decoded"""


class VisionBatcher:
    def __init__(self, policy: VisionPolicy, max_batch: int = 64) -> None:
        if max_batch < 1:
            raise ValueError(f"VisionBatcher max_batch must be >= 1, got {max_batch}")
        self.policy, self.max_batch = policy, max_batch
        self.stats = BatchStats()
        self._queue: deque[tuple[list[GenerationRequest], Future]] = deque()
        self._cv = threading.Condition()
        self._stop = False
        self._paused = False
        self._busy = False  # a batch is decoding
        self._thread: threading.Thread | None = None
        self.weights_path: str | None = None
        """the directory the weights were last reloaded from (None: as loaded at start)"""

    def start(self) -> VisionBatcher:
        with self._cv:
            if self._thread is None and not self._stop:
                self._thread = threading.Thread(target=self._loop, name="posttrain-vision-batch", daemon=True)
                self._thread.start()
        return self

    def submit(self, requests: Sequence[GenerationRequest]) -> Future:
        """Queue `requests`; the future gives their completions, in order (or the policy's error)."""
        fut: Future = Future()
        with self._cv:
            if self._stop:
                raise RuntimeError("VisionBatcher is closed")
            self._queue.append((list(requests), fut))
            self._cv.notify_all()
        return fut

    def close(self) -> None:
        """Stop the worker; requests still queued fail with RuntimeError."""
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=60)
        while self._queue:
            self._queue.popleft()[1].set_exception(RuntimeError("VisionBatcher closed before answering"))

    def pause(self, mode: str = "keep", timeout: float = 600.0) -> None:
        """Take no new batch; returns once the batch in flight (if any) is done."""
        if mode not in ("keep", "wait"):
            raise ValueError(f"pause mode must be 'keep' or 'wait', got {mode!r}")
        with self._cv:
            self._paused = True
            if not self._cv.wait_for(lambda: not self._busy, timeout=timeout):
                raise TimeoutError(f"pause: the batch in flight did not finish within {timeout:.0f} s")

    def resume(self) -> None:
        with self._cv:
            self._paused = False
            self._cv.notify_all()

    @property
    def paused(self) -> bool:
        return self._paused

    def reload_weights(self, weights_path: str) -> int:
        """Copy the directory's weights into the served model between two batches; returns the
        tensors loaded (a directory that does not fit the model is a ValueError naming why)."""
        with self.policy._lock:  # never under a decode
            n = load_weights_into(self.policy.model, weights_path)
            if self.policy.prefix_cache is not None:
                self.policy.prefix_cache.clear()
            self.weights_path = weights_path
        return n

    def reset_prefix_cache(self) -> None:
        with self.policy._lock:
            if self.policy.prefix_cache is not None:
                self.policy.prefix_cache.clear()

    def _take(self) -> list[tuple[list[GenerationRequest], Future]] | None:
        with self._cv:
            while (not self._queue or self._paused) and not self._stop:
                self._cv.wait()
            if self._stop:
                return None
            self._busy = True
            taken = [self._queue.popleft()]
            n = len(taken[0][0])
            while self._queue and n + len(self._queue[0][0]) <= self.max_batch:
                n += len(self._queue[0][0])
                taken.append(self._queue.popleft())
            return taken

    def _loop(self) -> None:
        while (taken := self._take()) is not None:
            flat = [r for requests, _ in taken for r in requests]
            try:
                outs: list[Completion] = self.policy.generate(flat) if flat else []
            except Exception as e:  # the policy's failure is each waiting request's answer
                for _, fut in taken:
                    fut.set_exception(e)
                continue
            finally:
                with self._cv:
                    self._busy = False
                    self._cv.notify_all()
            self.stats.batches += 1
            self.stats.requests += len(flat)
            self.stats.largest = max(self.stats.largest, len(flat))
            at = 0
            for requests, fut in taken:
                fut.set_result(outs[at:at + len(requests)])
                at += len(requests)
