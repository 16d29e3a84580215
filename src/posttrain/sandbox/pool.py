"""`SandboxPool`: sandboxes booted ahead of time, one fresh sandbox per episode.

A background thread keeps `size` sandboxes booted (supervisor up, fork-server importing its
preloads), so `pool.sandbox()` normally returns at once. A sandbox is never reused: the one an
episode used is closed when the episode's `with` block ends, and the pool boots a new one.
Before handing a sandbox out the pool checks that its supervisor answers; a dead one is closed
and replaced (counted in `stats["replaced"]`). If a sandbox breaks *during* an episode, the
caller sees `SandboxBroken` (an infrastructure failure, not a wrong answer) and simply asks for
the next one.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from typing import Iterator, Sequence

from posttrain.sandbox.base import Limits, Sandbox, SandboxError, SandboxUnavailable
from posttrain.sandbox.factory import open_sandbox

TAKE_TIMEOUT_S = 120.0
"""how long `sandbox()` waits for a booted sandbox before giving up"""


class SandboxPool:
    def __init__(self, size: int = 2, limits: Limits = Limits(), backend: str = "auto",
                 allow_unsandboxed: bool = False, preload: Sequence[str] = ()) -> None:
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"SandboxPool.size must be a positive integer, got {size!r}")
        self.size = size
        self._open = lambda: open_sandbox(limits, backend=backend,
                                          allow_unsandboxed=allow_unsandboxed, preload=preload)
        self._ready: queue.Queue = queue.Queue()
        self._cond = threading.Condition()
        self._booting = 0
        self._closed = False
        self.stats = {"booted": 0, "handed_out": 0, "replaced": 0, "boot_errors": 0}
        # the first boot is synchronous: a configuration error surfaces here, not in a thread
        self._ready.put(self._open())
        self.stats["booted"] += 1
        self._thread = threading.Thread(target=self._fill, name="sandbox-pool", daemon=True)
        self._thread.start()

    def _fill(self) -> None:
        failures = 0
        while True:
            with self._cond:
                while not self._closed and self._ready.qsize() >= self.size:
                    self._cond.wait()
                if self._closed:
                    return
            try:
                sb = self._open()
            except Exception as e:  # hand the error to a waiting caller; retry with back-off
                self.stats["boot_errors"] += 1
                failures += 1
                self._ready.put(e)
                time.sleep(min(5.0, 0.1 * 2 ** failures))
                continue
            failures = 0
            with self._cond:
                if self._closed:
                    sb.close()
                    return
                self.stats["booted"] += 1
                self._ready.put(sb)

    def _take(self) -> Sandbox:
        deadline = time.monotonic() + TAKE_TIMEOUT_S
        while True:
            if self._closed:
                raise SandboxError("the sandbox pool is closed")
            try:
                item = self._ready.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise SandboxUnavailable(
                    f"no sandbox booted within {TAKE_TIMEOUT_S:.0f} s") from None
            with self._cond:
                self._cond.notify()
            if isinstance(item, Exception):
                if isinstance(item, SandboxError):
                    raise item
                raise SandboxUnavailable(f"booting a sandbox failed: {item!r}") from item
            if item.alive():
                self.stats["handed_out"] += 1
                return item
            self.stats["replaced"] += 1
            item.close()

    @contextlib.contextmanager
    def sandbox(self) -> Iterator[Sandbox]:
        """A fresh, booted sandbox for one episode; closed when the block ends."""
        sb = self._take()
        try:
            yield sb
        finally:
            # closing takes ~0.1 s (kill, unmount, remove the cgroup): not on the caller's time.
            # The sandbox refuses calls from here on; its processes die in the background.
            sb.close(wait=False)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=TAKE_TIMEOUT_S)
        while True:
            try:
                item = self._ready.get_nowait()
            except queue.Empty:
                break
            if not isinstance(item, Exception):
                item.close()

    def __enter__(self) -> "SandboxPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
