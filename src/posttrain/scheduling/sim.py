"""A simulated workload: episode drivers whose environment steps sleep, and a generator of fixed
throughput. They plug into the scheduler exactly where real episodes and policies do, so the
benchmark and the tests exercise the same code path as a real run.

Everything random is drawn from the episode's own seed, so the same `EpisodeSpec` gives the same
trajectory whichever backend, thread or process runs it. Sleeps are real and scaled by
`time_scale` (so a workload can be replayed faster or slower).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass

from posttrain.scheduling.work import EpisodeSpec
from posttrain.values.episode import EpisodeResult
from posttrain.values.generation import (
    Completion,
    GenerationRequest,
    Message,
    PolicyVersion,
    SamplingParams,
)
from posttrain.values.trajectory import ErrorInfo, Status, Trajectory
from posttrain.values.verdict import Verdict


class SimInfraError(RuntimeError):
    """An injected infrastructure failure raised out of the driver (the sandbox 'died')."""


@dataclass(frozen=True)
class SimDomain:
    name: str
    step_s: float
    """median duration of one environment step (lognormal around it)"""
    start_s: float = 0.0
    """median start-up (sandbox boot) duration"""
    sigma: float = 0.5
    """spread of the lognormal step durations"""
    turns: tuple[int, int] = (1, 1)
    """fewest and most policy turns of an episode"""
    tokens: int = 64
    """mean generated tokens per turn"""
    pass_rate: float = 0.5
    """chance an episode passes (reward 1)"""
    failure_rate: float = 0.0
    """chance an episode fails with an infrastructure error at some step"""
    raise_share: float = 0.5
    """of those failures, the share raised as exceptions (the rest end as infra_error results)"""


def make_domains(n: int, *, seed: int = 0, step_range: tuple[float, float] = (0.001, 1.0),
                 sigma: float = 0.5, failure_rate: float = 0.05, turns: tuple[int, int] = (1, 4),
                 tokens: tuple[int, int] = (16, 256)) -> list[SimDomain]:
    """`n` domains whose median step times are log-uniform over `step_range` (three orders of
    magnitude by default), with per-step lognormal noise on top: a heavy-tailed mix."""
    rng = random.Random(seed)
    lo, hi = math.log(step_range[0]), math.log(step_range[1])
    out = []
    for i in range(n):
        step = math.exp(rng.uniform(lo, hi))
        t_lo = rng.randint(turns[0], turns[1])
        out.append(SimDomain(
            name=f"sim.d{i:04d}", step_s=step, start_s=step * rng.uniform(0.5, 2.0), sigma=sigma,
            turns=(t_lo, rng.randint(t_lo, turns[1])),
            tokens=int(math.exp(rng.uniform(math.log(tokens[0]), math.log(tokens[1])))),
            pass_rate=rng.uniform(0.2, 0.8), failure_rate=failure_rate))
    return out


class SimEpisode:
    """An `EpisodeDriver` that sleeps instead of running tools."""

    def __init__(self, domain: SimDomain, spec: EpisodeSpec, time_scale: float = 1.0) -> None:
        self.d, self.spec, self.scale = domain, spec, time_scale
        rng = self.rng = random.Random(spec.sampling_seed)
        self.turns = rng.randint(*domain.turns)
        self.fail_at: int | None = None
        self.fail_raises = False
        if rng.random() < domain.failure_rate:
            self.fail_at = rng.randint(0, self.turns)  # 0: at start-up
            self.fail_raises = rng.random() < domain.raise_share
        self.passed = rng.random() < domain.pass_rate
        self.turn = 0
        self._result: Trajectory | None = None

    def _sleep(self, median: float) -> None:
        if median > 0:
            time.sleep(self.scale * median * math.exp(self.d.sigma * self.rng.gauss(0.0, 1.0)))

    def _request(self) -> GenerationRequest:
        n = max(1, int(self.d.tokens * self.rng.uniform(0.5, 1.5)))
        return GenerationRequest(messages=(Message("user", f"{self.d.name} turn {self.turn}"),),
                                 sampling=SamplingParams(max_tokens=n),
                                 request_id=f"{self.spec.key}:{self.turn}",
                                 meta={"domain": self.d.name, "sim_tokens": n})

    def _fail(self, where: str) -> None:
        if self.fail_raises:
            raise SimInfraError(f"{self.d.name}: injected failure at turn {self.turn}")
        self._result = self._trajectory("infra_error", error=ErrorInfo(
            type="SimInfraError", message=f"injected failure at turn {self.turn}", where=where))

    def start(self) -> GenerationRequest | None:
        self._sleep(self.d.start_s)
        if self.fail_at == 0:
            self._fail("sandbox")
            return None
        return self._request()

    def advance(self, completion: Completion) -> GenerationRequest | None:
        if self._result is not None:
            raise RuntimeError(f"episode {self.spec.key} already finished")
        if completion.finish_reason == "error":
            self._result = self._trajectory("infra_error", error=ErrorInfo(
                type="PolicyError", message=completion.error or "generation failed", where="policy"))
            return None
        self._sleep(self.d.step_s)
        self.turn += 1
        if self.fail_at == self.turn:
            self._fail("env")
            return None
        if self.turn >= self.turns:
            reward = 1.0 if self.passed else 0.0
            self._result = self._trajectory("completed", reward=reward, verdict=Verdict(
                passed=self.passed, score=reward, verifier_version="sim@1"))
            return None
        return self._request()

    def result(self) -> EpisodeResult:
        if self._result is None:
            raise RuntimeError(f"episode {self.spec.key} has not finished")
        return EpisodeResult(self._result, None)

    def _trajectory(self, status: Status, **kw: object) -> Trajectory:
        s = self.spec
        return Trajectory(task_key=f"{s.domain}/{s.split}/{s.task_seed}", task_hash=f"sim-{s.task_seed}",
                          domain=s.domain, split=s.split, policy_version=s.policy_version,
                          status=status, seed=s.task_seed, sampling={"seed": s.sampling_seed},
                          group_id=s.group_id, attempt=s.attempt,
                          timings={"turns": float(self.turn)}, **kw)  # type: ignore[arg-type]


class SimFactory:
    """`EpisodeSpec -> SimEpisode`; picklable, so Ray actors can build episodes too."""

    def __init__(self, domains: Sequence[SimDomain], time_scale: float = 1.0) -> None:
        self.domains = {d.name: d for d in domains}
        self.time_scale = time_scale

    def __call__(self, spec: EpisodeSpec) -> SimEpisode:
        try:
            domain = self.domains[spec.domain]
        except KeyError:
            raise KeyError(f"SimFactory: no simulated domain {spec.domain!r}") from None
        return SimEpisode(domain, spec, self.time_scale)


class SimGenerator:
    """A `Policy` of fixed throughput: a call takes `call_s + tokens / tokens_per_s` (scaled)."""

    def __init__(self, tokens_per_s: float, call_s: float = 0.0, time_scale: float = 1.0,
                 name: str = "sim") -> None:
        self.tokens_per_s, self.call_s, self.time_scale = tokens_per_s, call_s, time_scale
        self.version = PolicyVersion(name=name)
        self.max_positions: int | None = None
        self.accepts_images = True  # simulated: it reads nothing, so it is shown everything
        self.busy_s = 0.0
        self.calls = 0

    def render(self, request: GenerationRequest) -> None:
        return None  # simulated: no tokenizer

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        counts = [int(r.meta.get("sim_tokens", r.sampling.max_tokens)) for r in requests]
        dt = self.time_scale * (self.call_s + sum(counts) / self.tokens_per_s)
        time.sleep(dt)
        self.busy_s += dt
        self.calls += 1
        return [Completion(text="x" * n, finish_reason="stop", token_ids=[0] * n, gen_s=dt)
                for n in counts]
