"""`SandboxPool`: booted sandboxes for episodes, reset to pristine between them (or fresh each).

A background thread keeps sandboxes booted (supervisor up, fork-server importing its preloads),
so `pool.sandbox()` normally returns at once. Two ways to serve episodes:

* `reuse=True` (the default): when an episode's `with` block ends, its sandbox is *reset*
  (`Sandbox.reset`: every process killed, /ws, /tmp, /dev/shm and $HOME back to pristine, IPC
  objects removed, then checked from the outside, a few milliseconds) and goes back to the pool.
  A sandbox whose reset is not clean (a process survived, a remount failed, the probe saw
  state) is closed and replaced by a fresh boot, and counted (`stats["discards"]`, with the
  reason in `stats["discard_reasons"]`). An episode that killed the sandbox's job server
  does not cost a boot: the reset starts a new one (`stats["server_restarts"]`). While
  callers use at most `size` at once, the pool boots `size` sandboxes and nothing more; a
  caller that asks for more (a driver that opens every episode at once) is not left waiting:
  unless a sandbox is being reset (it comes back in milliseconds), the pool boots for it, and
  closes what comes back beyond `size` idle ones (`stats["closed_idle"]`) once no caller has
  had to wait for `IDLE_GRACE_S` (demand that comes and goes, e.g. a check grading two tasks'
  episodes at once and then one, keeps its sandboxes instead of closing and booting them again).
* `reuse=False`: a sandbox is never reused; the one an episode used is closed when its block
  ends and the pool boots a new one (~150 ms each, off the caller's clock while `size` are
  ready).

Before handing a sandbox out the pool checks that its supervisor is still running (no round trip:
every sandbox in the pool answered a moment ago, at its boot or its reset; `reset.still_alive`);
a dead one is closed and replaced (`stats["replaced"]`). If a sandbox breaks *during* an episode, the caller sees
`SandboxBroken` (an infrastructure failure, not a wrong answer), the broken sandbox is closed,
and the next request gets another.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Iterator, Sequence

from posttrain.sandbox.base import DEFAULT_CLOCK, Limits, Sandbox, SandboxError, SandboxUnavailable
from posttrain.sandbox.factory import open_sandbox
from posttrain.sandbox.reset import after_episode, still_alive

TAKE_TIMEOUT_S = 120.0
"""how long `sandbox()` waits for a booted sandbox before giving up"""
IDLE_GRACE_S = 30.0
"""how long sandboxes beyond `size` stay idle after a caller last had to wait for one"""
MAX_EPISODES = 1000
"""episodes one sandbox serves before it is replaced by a fresh boot (pid numbers, cgroup event
counters and the devpts instance keep counting across resets; a bound keeps them small)"""


class SandboxPool:
    def __init__(self, size: int = 2, limits: Limits = Limits(), backend: str = "auto",
                 allow_unsandboxed: bool = False, preload: Sequence[str] = (), *,
                 reuse: bool = True, clock: int | None = DEFAULT_CLOCK,
                 max_episodes: int = MAX_EPISODES) -> None:
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"SandboxPool.size must be a positive integer, got {size!r}")
        if not isinstance(reuse, bool):
            raise ValueError(f"SandboxPool.reuse must be True or False, got {reuse!r}")
        if isinstance(max_episodes, bool) or not isinstance(max_episodes, int) or max_episodes < 1:
            raise ValueError(f"SandboxPool.max_episodes must be a positive integer, "
                             f"got {max_episodes!r}")
        self.size = size
        self.reuse = reuse
        self.max_episodes = max_episodes
        self._open = lambda: open_sandbox(limits, backend=backend, clock=clock,
                                          allow_unsandboxed=allow_unsandboxed, preload=preload)
        self._ready: queue.Queue = queue.Queue()
        self._cond = threading.Condition()
        self._live = 0
        """sandboxes booting, ready or in use"""
        self._booting = 0
        self._resetting = 0
        """sandboxes being reset: each comes back in a few milliseconds (or is replaced)"""
        self._waiting = 0
        """callers blocked in `sandbox()` for want of a ready sandbox"""
        self._surplus_until = 0.0
        """until when (monotonic) idle sandboxes beyond `size` are kept: IDLE_GRACE_S after a
        caller last had to wait"""
        self._episodes: dict[str, int] = {}
        self._closed = False
        self.stats: dict = {"booted": 0, "handed_out": 0, "replaced": 0, "boot_errors": 0,
                            "resets": 0, "discards": 0, "discard_reasons": {},
                            "closed_idle": 0, "reset_s_total": 0.0, "server_restarts": 0}
        # the first boot is synchronous: a configuration error surfaces here, not in a thread
        self._live = 1
        self._ready.put(self._open())
        self.stats["booted"] += 1
        self._thread = threading.Thread(target=self._fill, name="sandbox-pool", daemon=True)
        self._thread.start()

    def _wanted(self) -> bool:
        """Whether the filler should boot another sandbox now (called under the lock)."""
        ready = self._ready.qsize()
        if self.reuse:  # sandboxes come back: boot for a waiting caller only if none will
            return self._live < self.size or self._waiting > ready + self._booting + self._resetting
        return ready < self.size

    def _fill(self) -> None:
        failures = 0
        while True:
            with self._cond:
                while not self._closed and not self._wanted():
                    surplus = self.reuse and self._ready.qsize() > self.size
                    left = self._surplus_until - time.monotonic()
                    if surplus and left <= 0:
                        self._trim()
                        continue
                    self._cond.wait(timeout=left if surplus else None)
                if self._closed:
                    return
                self._live += 1
                self._booting += 1
            try:
                sb = self._open()
            except Exception as e:  # hand the error to a waiting caller; retry with back-off
                with self._cond:
                    self._live -= 1
                    self._booting -= 1
                self.stats["boot_errors"] += 1
                failures += 1
                self._ready.put(e)
                time.sleep(min(5.0, 0.1 * 2 ** failures))
                continue
            failures = 0
            with self._cond:
                self._booting -= 1
                if self._closed:
                    self._live -= 1
                    sb.close()
                    return
                self.stats["booted"] += 1
                self._ready.put(sb)

    def _trim(self) -> None:
        """Close idle sandboxes beyond `size` (called by the filler, under the lock)."""
        while self._ready.qsize() > self.size:
            try:
                item = self._ready.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, Exception):  # a boot error waits for a caller: keep it
                self._ready.put(item)
                return
            self.stats["closed_idle"] += 1
            self._retire(item, wait=False)

    def _retire(self, sb: Sandbox, *, wait: bool) -> None:
        """Close a sandbox the pool will not hand out again; the filler boots a replacement."""
        self._episodes.pop(sb.id, None)
        sb.close(wait=wait)
        with self._cond:
            self._live -= 1
            self._cond.notify()

    def _take(self) -> Sandbox:
        deadline = time.monotonic() + TAKE_TIMEOUT_S
        while True:
            if self._closed:
                raise SandboxError("the sandbox pool is closed")
            try:
                item = self._ready.get_nowait()
            except queue.Empty:
                with self._cond:
                    self._waiting += 1
                    self._surplus_until = time.monotonic() + IDLE_GRACE_S
                    self._cond.notify()
                try:
                    item = self._ready.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    raise SandboxUnavailable(
                        f"no sandbox booted within {TAKE_TIMEOUT_S:.0f} s") from None
                finally:
                    with self._cond:
                        self._waiting -= 1
            with self._cond:
                self._cond.notify()
            if isinstance(item, Exception):
                if isinstance(item, SandboxError):
                    raise item
                raise SandboxUnavailable(f"booting a sandbox failed: {item!r}") from item
            if still_alive(item):
                self.stats["handed_out"] += 1
                return item
            self.stats["replaced"] += 1
            self._retire(item, wait=True)

    def _give_back(self, sb: Sandbox) -> None:
        episodes = self._episodes.get(sb.id, 0) + 1
        self._episodes[sb.id] = episodes
        action = after_episode(reuse=self.reuse, closed=sb.closed, episodes=episodes,
                               max_episodes=self.max_episodes)
        if action == "reset" and not self._closed:
            with self._cond:
                self._resetting += 1
            try:
                report = sb.reset()
            except BaseException:
                with self._cond:
                    self._resetting -= 1
                    self._cond.notify()
                raise
            with self._cond:  # episodes end on several threads at once
                # back in the queue (or known to be discarded) in the same step: the filler
                # boots for a waiting caller only if this one does not come back
                self._resetting -= 1
                self._cond.notify()
                self.stats["reset_s_total"] += report.seconds
                self.stats["server_restarts"] += bool(report.details.get("server_restarted"))
                if report.reusable:
                    self.stats["resets"] += 1
                    if (self._ready.qsize() < self.size or self._waiting
                            or time.monotonic() < self._surplus_until):
                        self._ready.put(sb)
                        self._cond.notify()  # the filler closes a surplus once the grace ends
                        return
                    self.stats["closed_idle"] += 1  # more idle sandboxes than the pool keeps
                else:
                    self.stats["discards"] += 1
                    why = report.reason.split(":")[0]
                    reasons = self.stats["discard_reasons"]
                    reasons[why] = reasons.get(why, 0) + 1
        # closing takes ~0.1 s (kill, unmount, remove the cgroup): not on the caller's time.
        # The sandbox refuses calls from here on; its processes die in the background.
        self._retire(sb, wait=False)

    @contextlib.contextmanager
    def sandbox(self) -> Iterator[Sandbox]:
        """A booted sandbox for one episode, pristine (fresh or reset); given back (reset, or
        closed) when the block ends."""
        sb = self._take()
        try:
            yield sb
        finally:
            self._give_back(sb)

    def wait_ready(self, timeout: float = TAKE_TIMEOUT_S) -> bool:
        """Wait until `size` sandboxes are booted and waiting (a warm pool, e.g. before a
        measurement); False if that did not happen within `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while self._ready.qsize() < self.size:
            if time.monotonic() > deadline or self._closed:
                return False
            time.sleep(0.01)
        return True

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

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
