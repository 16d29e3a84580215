"""Episodes on Ray actors, so that one run spreads over a Ray cluster.

Each actor (`EpisodeHost`, a threaded actor: `concurrency` episodes at once) hosts the drivers it
started: environment steps and verification (which runs inside the episode's last `advance`) both
run there, next to the sandbox. Generation stays with the scheduler's batcher, so requests from
episodes on every actor still go to the policy in shared batches. An episode is sticky to its
actor; a new one goes to the actor hosting the fewest.

Ray is optional: it is imported when a `RayBackend` is opened, and the caller starts Ray first
(`ray.init(address=...)` for a cluster, `ray.init(num_cpus=2, include_dashboard=False)` for a
local one). If an actor dies, the episodes it hosted fail as infrastructure errors (re-run from
scratch by the scheduler) and a fresh actor takes its place.

What this does not do: place actors by resource (pass `actor_options`, e.g. `{"num_cpus": 1,
"resources": {"sandbox": 1}}`), or run the scheduler itself anywhere but the driver process.
"""

from __future__ import annotations

from typing import Any

from posttrain.scheduling.backends import Step, advance_episode, start_episode
from posttrain.scheduling.work import EpisodeDriver, EpisodeFactory, EpisodeSpec
from posttrain.values.generation import Completion


class EpisodeHost:
    """The actor body: a table of running drivers. Plain Python, wrapped by `ray.remote`."""

    def __init__(self, factory: EpisodeFactory) -> None:
        self.factory = factory
        self.episodes: dict[str, EpisodeDriver] = {}

    def start(self, key: str, spec: EpisodeSpec) -> Step:
        driver, request, traj, secs = start_episode(self.factory, spec)
        if request is not None:
            self.episodes[key] = driver
        return request, traj, secs

    def advance(self, key: str, completion: Completion) -> Step:
        request, traj, secs = advance_episode(self.episodes[key], completion)
        if request is None:
            del self.episodes[key]
        return request, traj, secs

    def discard(self, key: str) -> None:
        self.episodes.pop(key, None)

    def ping(self) -> int:
        return len(self.episodes)


class RayBackend:
    name = "ray"

    def __init__(self, factory: EpisodeFactory, num_workers: int = 2, concurrency: int = 16,
                 actor_options: dict[str, Any] | None = None) -> None:
        if num_workers < 1:
            raise ValueError(f"RayBackend.num_workers must be >= 1, got {num_workers}")
        if concurrency < 1:
            raise ValueError(f"RayBackend.concurrency must be >= 1, got {concurrency}")
        self.factory = factory
        self.num_workers, self.concurrency = num_workers, concurrency
        self.capacity = num_workers * concurrency
        self.actor_options = dict(actor_options or {"num_cpus": 0})
        self.busy_s = 0.0
        self._ray: Any = None
        self._cls: Any = None
        self._actors: list[Any] = []
        self._load: list[int] = []
        self._hosted: dict[str, int] = {}

    def open(self) -> None:
        try:
            import ray
        except ImportError as e:  # pragma: no cover - depends on the install
            raise RuntimeError("the Ray backend needs Ray: pip install 'ray>=2.30' "
                               "(or posttrain[ray])") from e
        if not ray.is_initialized():
            raise RuntimeError("RayBackend: call ray.init(...) before opening the backend "
                               "(ray.init(address='auto') for a running cluster)")
        self._ray = ray
        self._cls = ray.remote(EpisodeHost).options(max_concurrency=self.concurrency, **self.actor_options)
        self._actors = [self._cls.remote(self.factory) for _ in range(self.num_workers)]
        self._load = [0] * self.num_workers
        ray.get([a.ping.remote() for a in self._actors])  # fail here, not mid-run, if they cannot start

    async def _call(self, index: int, method: str, *args: Any) -> Step:
        try:
            step = await getattr(self._actors[index], method).remote(*args)
        except self._ray.exceptions.RayActorError:
            self._replace(index)
            raise
        self.busy_s += step[-1]
        return step

    def _replace(self, index: int) -> None:
        self._actors[index] = self._cls.remote(self.factory)
        self._load[index] = 0
        self._hosted = {k: i for k, i in self._hosted.items() if i != index}

    async def start(self, spec: EpisodeSpec, inline: bool = False) -> tuple[Any, Step]:
        index = min(range(self.num_workers), key=self._load.__getitem__)
        self._load[index] += 1
        self._hosted[spec.key] = index
        handle = (index, spec.key)
        try:
            step = await self._call(index, "start", spec.key, spec)
        except BaseException:
            self._release(handle)
            raise
        if step[0] is None:
            self._release(handle)
        return handle, step

    async def advance(self, handle: tuple[int, str], completion: Completion, inline: bool = False) -> Step:
        step = await self._call(handle[0], "advance", handle[1], completion)
        if step[0] is None:
            self._release(handle)
        return step

    def discard(self, handle: Any) -> None:
        if handle is None:
            return
        index, key = handle
        self._actors[index].discard.remote(key)  # fire and forget
        self._release(handle)

    def _release(self, handle: tuple[int, str]) -> None:
        index, key = handle
        if self._hosted.pop(key, None) is not None:
            self._load[index] -= 1

    async def close(self) -> None:
        for actor in self._actors:
            try:
                self._ray.kill(actor)
            except Exception:  # noqa: BLE001 - an actor already gone is fine at teardown
                pass
        self._actors = []
