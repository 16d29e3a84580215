"""The units the scheduler hands out and gets back, and the episode-driver contract.

The scheduler is generic over *episode drivers*: anything with `start`, `advance` and `result`
(`posttrain.rollout.episode.Episode` is one; `posttrain.scheduling.sim.SimEpisode` is the
simulated one of the benchmark). A factory turns an `EpisodeSpec` into a driver; it is called on
the worker that will run the episode (a thread, or a Ray actor), so it must be picklable for the
Ray backend.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol, runtime_checkable

from posttrain.values.episode import EpisodeResult
from posttrain.values.generation import Completion, GenerationRequest
from posttrain.values.task import Task
from posttrain.values.trajectory import Trajectory


@runtime_checkable
class EpisodeDriver(Protocol):
    def start(self) -> GenerationRequest | None:
        """Set the episode up (sandbox, environment reset); the first request, or None if the
        episode finished without generating (e.g. it failed to start: see `result`)."""
        ...

    def advance(self, completion: Completion) -> GenerationRequest | None:
        """Apply one completion (tools, and the verifier at the end; may block for long); the next
        request, or None when the episode is over."""
        ...

    def result(self) -> EpisodeResult:
        """The finished episode: its trajectory (completed, truncated or infra_error), its task
        and its final workspace."""
        ...


class EpisodeSpec(NamedTuple):
    """One member of one group, at one attempt: everything a factory needs to build a driver.
    (A named tuple: immutable, picklable, and cheap to make — one is made per launch.)"""

    group_id: str
    """'<domain>#<n>': the n-th group drawn for the domain; stable across restarts"""
    domain: str
    tier: str
    split: str
    """'train' or 'eval': the split the task is drawn from"""
    member: int
    """index of this episode in its group, 0..G-1"""
    attempt: int
    """0 for the first run; each re-run (after an infra error or a restart) increments it"""
    task_seed: int
    """the seed the group's task is drawn with (every member shares it)"""
    sampling_seed: int
    """this episode's own seed (sampling, simulated randomness), derived from group, member,
    attempt; distinct from the task's seed, which `Trajectory.seed` records"""
    policy_version: str
    """name of the policy version the group was admitted under"""
    version: int
    """its index: the number of policy updates before it"""
    task: Task | None = None
    """the group's task, resolved once by the engine when the group is first launched and handed
    intact to every member, its result and the store (None for simulated episodes)"""

    @property
    def key(self) -> str:
        return f"{self.group_id}/{self.member}/{self.attempt}"


EpisodeFactory = Callable[[EpisodeSpec], EpisodeDriver]


class TaskSource(Protocol):
    """Where the engine gets a group's task (once per group, in the engine's process) and the
    turns a scripted policy plays for it."""

    def task_for(self, spec: EpisodeSpec) -> Task:
        ...

    def script_for(self, spec: EpisodeSpec, task: Task, role: str) -> Sequence[str]:
        """The turns `role` ('oracle', a negative's name) names for `task`; raises ValueError
        when the domain has no such script."""
        ...


@dataclass(slots=True)  # one per episode and per group
class Usage:
    """What one episode consumed, measured by the scheduler (not reported by the episode)."""

    sandbox_s: float = 0.0
    """worker seconds spent in start/advance/result (environment steps, verification)"""
    gen_s: float = 0.0
    """generator seconds attributed to its requests (a batch's time split by tokens)"""
    tokens: int = 0
    """generated tokens"""
    queue_s: float = 0.0
    """time between becoming ready to launch and being launched"""

    def add(self, other: Usage) -> None:
        self.sandbox_s += other.sandbox_s
        self.gen_s += other.gen_s
        self.tokens += other.tokens
        self.queue_s += other.queue_s


@dataclass
class Group:
    """G episodes of one task under one policy version: what the trainer consumes."""

    group_id: str
    domain: str
    tier: str
    task_seed: int
    policy_version: str
    version: int
    results: list[EpisodeResult]
    """the members, in member order, all completed or truncated, each with its task and final
    workspace (a recovered group's come from the store: task and workspace None)"""
    usage: Usage = field(default_factory=Usage)
    """summed over members and over their failed attempts"""
    admitted_at: float = 0.0
    completed_at: float = 0.0
    staleness: int = 0
    """trainer version when taken minus `version` (also set on each trajectory)"""
    recovered: bool = False
    """found complete in the store on resume, not run again: its trajectories come from
    `load_group` (empty without one: load them from the store by `group_id`)"""

    @property
    def trajectories(self) -> list[Trajectory]:
        return [r.trajectory for r in self.results]

    @property
    def rewards(self) -> list[float]:
        return [float(t.reward) for t in self.trajectories if t.reward is not None]

    @property
    def has_signal(self) -> bool:
        """False for a zero-variance group (all rewards equal): GRPO learns nothing from it."""
        r = self.rewards
        return len(r) > 1 and max(r) != min(r)

    @property
    def all_passed(self) -> bool:
        return all(passed(t) for t in self.trajectories)


def passed(traj: Trajectory) -> bool:
    """A trajectory's pass/fail: its verdict if it has one, else a full reward."""
    if traj.verdict is not None:
        return bool(traj.verdict.passed)
    return traj.reward is not None and traj.reward >= 1.0


def derive_seed(*parts: Any) -> int:
    """A stable 31-bit seed from any parts (the same parts, the same seed, in every process)."""
    digest = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") & 0x7FFFFFFF


class SeedPrefix:
    """`derive_seed(*parts, *rest)` for many `rest` after the same leading `parts`, with the hash
    of those parts computed once (a group's task seed: the run's seed and the domain are constant,
    only the group's index changes). Gives exactly `derive_seed`'s seeds."""

    __slots__ = ("_hash",)

    def __init__(self, *parts: Any) -> None:
        if not parts:
            raise ValueError("SeedPrefix needs at least one leading part")
        self._hash = hashlib.blake2b(("\x1f".join(map(str, parts)) + "\x1f").encode(), digest_size=8)

    def __call__(self, *rest: Any) -> int:
        h = self._hash.copy()
        h.update("\x1f".join(map(str, rest)).encode())
        return int.from_bytes(h.digest(), "big") & 0x7FFFFFFF


def mix_seed(seed: int, member: int, attempt: int) -> int:
    """An episode's seed from its group's seed, member and attempt: the cheap per-launch
    counterpart of `derive_seed` (distinct for every member and attempt of a group, the same in
    every process; not a hash, which a sampling seed does not need)."""
    return (seed * 1_000_003 + member * 10_007 + attempt + 1) % 2_147_483_647
