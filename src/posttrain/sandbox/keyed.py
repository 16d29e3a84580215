"""`ConfigPool`: idle sandboxes of many configurations, reset to pristine between uses.

`SandboxPool` serves one configuration (the episodes of a run) and keeps it booted ahead in a
background thread. Graders need sandboxes of whatever configuration the task asks for (the
episode's backend and limits, a family's preloads, a task's image), one at a time and at
unpredictable moments; booting one per graded episode costs ~150-400 ms. `ConfigPool` keeps the
sandboxes it booted after use, keyed by their configuration:

* `with pool.sandbox(limits, backend=..., preload=..., image=...) as sb:` hands out an idle
  sandbox of exactly that configuration (after checking that its supervisor answers), or boots
  one when there is none;
* when the block ends the sandbox is reset (`Sandbox.reset`: every process killed, /ws, /tmp,
  /dev/shm and $HOME back to pristine, then checked from the outside) and kept for the next
  user of that configuration. A sandbox whose reset is not clean is closed and counted
  (`stats["discards"]`, the reason in `stats["discard_reasons"]`): the next user boots another.

With `background_reset=True` the reset runs on a thread of its own once the block ends, so the
caller (a grader) does not wait for it (a reset is ~10-30 ms, most of it the kernel settling the
unmounts); a later user of that configuration waits for a reset in flight rather than booting,
and only a sandbox whose reset was clean is ever handed out. `settle()` waits for those resets.

Only sandboxes this pool booted ever enter it (never one a caller brings). At most
`max_idle_per_key` idle sandboxes of one configuration and `max_idle` in all are kept; beyond
that the least recently used are closed (`stats["closed_idle"]`), so a run over many images
holds a bounded number of booted sandboxes. A sandbox serves at most `max_episodes` uses.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from posttrain.sandbox.base import DEFAULT_CLOCK, Limits, Sandbox
from posttrain.sandbox.pool import MAX_EPISODES
from posttrain.sandbox.reset import ResetReport, after_episode, still_alive

MAX_IDLE_PER_KEY = 4
"""idle sandboxes kept per configuration (graders run as many at a time as episodes end at
once: a self-check plays two tasks' episodes on two workers each)"""
MAX_IDLE = 8
"""idle sandboxes kept in all, over every configuration"""
RESET_WAIT_S = 120.0
"""how long a user waits for a reset in flight (a reset's own limit is 60 s) before booting"""


def config_key(limits: Limits, backend: str, allow_unsandboxed: bool, preload: Sequence[str],
               image: dict | None, clock: int | None, two_uids: bool = False) -> tuple:
    """What makes two sandboxes interchangeable: equal keys boot equal sandboxes."""
    return (limits, backend, bool(allow_unsandboxed), tuple(preload),
            None if image is None else json.dumps(image, sort_keys=True, default=str), clock,
            bool(two_uids))


class ConfigPool:
    def __init__(self, *, max_idle_per_key: int = MAX_IDLE_PER_KEY, max_idle: int = MAX_IDLE,
                 max_episodes: int = MAX_EPISODES, opener: Callable[..., Sandbox] | None = None,
                 background_reset: bool = False) -> None:
        for name, value in (("max_idle_per_key", max_idle_per_key), ("max_idle", max_idle),
                            ("max_episodes", max_episodes)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"ConfigPool.{name} must be a positive integer, got {value!r}")
        self.max_idle_per_key, self.max_idle, self.max_episodes = max_idle_per_key, max_idle, max_episodes
        from posttrain.sandbox.factory import open_sandbox

        self._opener: Callable[..., Sandbox] = opener if opener is not None else open_sandbox
        self._lock = threading.Lock()
        self._settled = threading.Condition(self._lock)
        """notified whenever a reset in flight ends"""
        self.background_reset = background_reset
        self._resetting: dict[tuple, int] = {}
        """resets in flight, per configuration"""
        self._idle: list[tuple[tuple, Any]] = []
        """(key, sandbox), least recently given back first (`SupervisedSandbox`es: `alive`,
        `close(wait=)`, beyond the `Sandbox` protocol)"""
        self._uses: dict[str, int] = {}
        self._closed = False
        self.stats: dict = {"booted": 0, "reused": 0, "replaced": 0, "resets": 0, "discards": 0,
                            "discard_reasons": {}, "closed_idle": 0, "reset_s_total": 0.0,
                            "server_restarts": 0}

    def idle(self) -> int:
        """How many reset sandboxes wait for a user now."""
        with self._lock:
            return len(self._idle)

    def settle(self, timeout: float = RESET_WAIT_S) -> bool:
        """Wait until no reset is in flight; False if some still were after `timeout` seconds."""
        with self._lock:
            return self._settled.wait_for(lambda: not any(self._resetting.values()), timeout)

    @contextlib.contextmanager
    def sandbox(self, limits: Limits = Limits(), *, backend: str = "auto",
                allow_unsandboxed: bool = False, preload: Sequence[str] = (),
                image: dict | None = None, clock: int | None = DEFAULT_CLOCK,
                two_uids: bool = False) -> Iterator[Sandbox]:
        """A pristine sandbox of this configuration (reset or freshly booted), given back (reset
        and kept, or closed) when the block ends. Arguments as for `open_sandbox`; boot errors
        propagate unchanged."""
        key = config_key(limits, backend, allow_unsandboxed, preload, image, clock, two_uids)
        sb = self._take(key)
        if sb is None:
            sb = self._opener(limits, backend=backend, allow_unsandboxed=allow_unsandboxed,
                              preload=tuple(preload), clock=clock,
                              **({"image": image} if image is not None else {}),
                              **({"two_uids": True} if two_uids else {}))
            with self._lock:
                self.stats["booted"] += 1
        try:
            yield sb
        finally:
            self._give_back(key, sb)

    def _take(self, key: tuple) -> Any:
        deadline = time.monotonic() + RESET_WAIT_S
        while True:
            with self._lock:
                while True:
                    i = next((i for i in range(len(self._idle) - 1, -1, -1) if self._idle[i][0] == key), None)
                    left = deadline - time.monotonic()
                    if i is not None or not self._resetting.get(key) or left <= 0:
                        break
                    self._settled.wait(left)  # a reset of this configuration is in flight
                if i is None:
                    return None
                _, sb = self._idle.pop(i)
            if still_alive(sb):
                with self._lock:
                    self.stats["reused"] += 1
                return sb
            with self._lock:
                self.stats["replaced"] += 1
            self._close(sb)

    def _close(self, sb: Any) -> None:
        self._uses.pop(sb.id, None)
        # closing takes ~0.1 s (kill, unmount, free the cgroup): not on the grader's time
        try:
            sb.close(wait=False)
        except TypeError:  # a Sandbox implementation without background closing
            sb.close()

    def _give_back(self, key: tuple, sb: Any) -> None:
        with self._lock:
            uses = self._uses.get(sb.id, 0) + 1
            self._uses[sb.id] = uses
            closed = self._closed
        action = after_episode(reuse=not closed, closed=getattr(sb, "closed", False),
                               episodes=uses, max_episodes=self.max_episodes)
        if action != "reset":
            self._close(sb)
            return
        if not self.background_reset:
            self._reset_and_keep(key, sb)
            return
        with self._lock:
            self._resetting[key] = self._resetting.get(key, 0) + 1
        threading.Thread(target=self._reset_in_background, args=(key, sb), name=f"reset-{sb.id}").start()

    def _reset_in_background(self, key: tuple, sb: Any) -> None:
        try:
            self._reset_and_keep(key, sb)
        finally:
            with self._lock:
                self._resetting[key] -= 1
                self._settled.notify_all()

    def _reset_and_keep(self, key: tuple, sb: Any) -> None:
        """Reset `sb`; keep it idle if the reset was clean (and bounds allow), else close it."""
        try:
            report = sb.reset()
        except Exception as error:  # noqa: BLE001 - a Sandbox whose reset raises: not reusable
            report = ResetReport(False, f"{type(error).__name__}: {error}")
        evicted: list[Any] = []
        with self._lock:
            self.stats["reset_s_total"] += report.seconds
            self.stats["server_restarts"] += bool(report.details.get("server_restarted"))
            if not report.reusable:
                self.stats["discards"] += 1
                why = report.reason.split(":")[0]
                reasons = self.stats["discard_reasons"]
                reasons[why] = reasons.get(why, 0) + 1
                evicted.append(sb)
            elif self._closed:
                evicted.append(sb)
            else:
                self.stats["resets"] += 1
                same = [i for i, (k, _) in enumerate(self._idle) if k == key]
                if len(same) >= self.max_idle_per_key:
                    evicted.append(self._idle.pop(same[0])[1])
                self._idle.append((key, sb))
                while len(self._idle) > self.max_idle:
                    evicted.append(self._idle.pop(0)[1])
                self.stats["closed_idle"] += sum(e is not sb for e in evicted)
        for e in evicted:
            self._close(e)

    def close(self) -> None:
        """Close every idle sandbox; sandboxes in use are closed when they come back."""
        with self._lock:
            self._closed = True
        self.settle()  # a sandbox whose reset is in flight is closed when that reset ends
        with self._lock:
            idle, self._idle = self._idle, []
        for _, sb in idle:
            self._uses.pop(sb.id, None)
            sb.close()

    def __enter__(self) -> ConfigPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
