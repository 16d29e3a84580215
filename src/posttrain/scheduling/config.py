"""Typed settings of the scheduler, one small dataclass per concern.

Every field has a docstring under it (CleanRL style); `__post_init__` checks values and names the
field and the value it rejects.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

ShareBy = Literal["samples", "cost"]


def _check(cond: bool, where: str, message: str, value: object) -> None:
    if not cond:
        raise ValueError(f"{where}: {message}, got {value!r}")


@dataclass(frozen=True)
class DomainSpec:
    """How one domain (task type) takes part in a run."""

    name: str
    """domain name: a registry name for real episodes, any string for simulated ones"""
    weight: float = 1.0
    """share of this domain within its tier, relative to the weights of the tier's other domains"""
    tier: str = "train"
    """priority tier (one of `SchedulerConfig.tiers`); a higher tier always goes first"""
    split: Literal["train", "eval"] = "train"
    """which split its tasks are drawn from (evaluation domains: 'eval')"""
    max_concurrency: int | None = None
    """most episodes of this domain in flight at once (sandbox-hungry domains); None: no limit"""
    max_sample_share: float | None = None
    """cap on this domain's share of its tier's samples over the sliding window; None: no cap.
    Soft: a capped domain still runs when no uncapped domain of the tier can."""
    max_cost_share: float | None = None
    """cap on this domain's share of its tier's cost (see `SchedulerConfig.share_by`) over the
    sliding window; None: no cap. Soft in the same way."""
    group_size: int | None = None
    """episodes per group for this domain; None: `SchedulerConfig.group_size`"""
    continuous: bool = True
    """True: the scheduler keeps drawing new groups of this domain (training, background work);
    False: it runs only groups handed to `submit()` (an evaluation set)"""
    sandboxed: bool = False
    """its episodes hold a sandbox while they run: they count against
    `SchedulerConfig.max_sandboxes` (`posttrain.envs.needs_sandbox` says which domains do)"""
    light: bool = False
    """its episode steps are short in-process Python (no sandbox, an in-process verifier): the
    local backend runs them on the engine's thread, since the GIL would serialise them on a
    worker anyway and the hand-off costs more than the step"""

    def __post_init__(self) -> None:
        where = f"DomainSpec {self.name!r}"
        _check(bool(self.name), "DomainSpec.name", "must be non-empty", self.name)
        _check(self.weight > 0, f"{where}.weight", "must be > 0", self.weight)
        _check(self.split in ("train", "eval"), f"{where}.split", "must be 'train' or 'eval'", self.split)
        if self.max_concurrency is not None:
            _check(self.max_concurrency >= 1, f"{where}.max_concurrency", "must be >= 1 or None",
                   self.max_concurrency)
        for name in ("max_sample_share", "max_cost_share"):
            value = getattr(self, name)
            if value is not None:
                _check(0 < value <= 1, f"{where}.{name}", "must be in (0, 1] or None", value)
        if self.group_size is not None:
            _check(self.group_size >= 1, f"{where}.group_size", "must be >= 1 or None", self.group_size)
        _check(not (self.light and self.sandboxed), f"{where}.light", "cannot be set on a sandboxed domain",
               self.light)


@dataclass(frozen=True)
class RetryConfig:
    """What happens to an episode that ends in `infra_error` (or raises, or times out)."""

    max_retries: int = 3
    """re-runs of one group member after infrastructure failures; past it the group is dropped"""
    backoff_s: float = 0.5
    """delay before the first retry; doubles with each further retry"""
    backoff_max_s: float = 30.0
    """ceiling of the retry delay"""
    jitter: float = 0.25
    """each delay is stretched by a random factor in [1, 1 + jitter] so retries do not stampede"""
    episode_timeout_s: float | None = None
    """wall time after which a running episode is abandoned as an infrastructure failure. The
    worker thread cannot be killed: the episode's own limits (sandbox time limits) must end it;
    its late result is discarded. None: no scheduler-side timeout."""
    policy_outage_s: float | None = 300.0
    """how long every episode may fail in the policy backend (a server that is down, or one that
    rejects every request) before the scheduler gives up and `take` raises `SchedulerStalled`
    saying so, instead of retrying forever. Any episode that gets its completions resets the
    clock. None: retry forever."""

    def __post_init__(self) -> None:
        _check(self.max_retries >= 0, "RetryConfig.max_retries", "must be >= 0", self.max_retries)
        _check(self.backoff_s >= 0, "RetryConfig.backoff_s", "must be >= 0", self.backoff_s)
        _check(self.backoff_max_s >= self.backoff_s, "RetryConfig.backoff_max_s",
               "must be >= backoff_s", self.backoff_max_s)
        _check(self.jitter >= 0, "RetryConfig.jitter", "must be >= 0", self.jitter)
        if self.policy_outage_s is not None:
            _check(self.policy_outage_s > 0, "RetryConfig.policy_outage_s", "must be > 0 or None",
                   self.policy_outage_s)
        if self.episode_timeout_s is not None:
            _check(self.episode_timeout_s > 0, "RetryConfig.episode_timeout_s", "must be > 0 or None",
                   self.episode_timeout_s)


@dataclass(frozen=True)
class QuarantineConfig:
    """When a domain's infrastructure is judged broken. Policy-backend errors do not count."""

    window: int = 50
    """the last this many episodes of a domain are looked at"""
    min_episodes: int = 20
    """no verdict before this many episodes are in the window"""
    max_error_rate: float = 0.5
    """a domain whose infra-error rate in the window exceeds this is quarantined"""

    def __post_init__(self) -> None:
        _check(self.window >= 1, "QuarantineConfig.window", "must be >= 1", self.window)
        _check(1 <= self.min_episodes <= self.window, "QuarantineConfig.min_episodes",
               "must be in [1, window]", self.min_episodes)
        _check(0 < self.max_error_rate <= 1, "QuarantineConfig.max_error_rate", "must be in (0, 1]",
               self.max_error_rate)


@dataclass(frozen=True)
class AdaptiveConfig:
    """Learning-signal–aware sampling of the trainer tier (other tiers are never adapted).

    A group whose rewards are all equal (all pass or all fail) gives GRPO no gradient. A domain's
    effective weight is its configured weight times the share of its recent groups that had
    signal, floored at `floor`. A domain whose last `retire_after` groups all passed completely is
    saturated and retired. All-fail domains are down-weighted but never retired: the policy may
    still learn them."""

    enabled: bool = True
    """False: effective weights are the configured weights, nothing is retired"""
    window: int = 20
    """groups per domain that the signal share is computed over"""
    min_groups: int = 5
    """no down-weighting before a domain has this many completed groups"""
    floor: float = 0.1
    """smallest weight multiplier; > 0 so that no domain is starved"""
    retire_after: int | None = 20
    """consecutive all-pass groups that retire a domain; None: never retire"""

    def __post_init__(self) -> None:
        _check(self.window >= 1, "AdaptiveConfig.window", "must be >= 1", self.window)
        _check(1 <= self.min_groups <= self.window, "AdaptiveConfig.min_groups", "must be in [1, window]",
               self.min_groups)
        _check(0 < self.floor <= 1, "AdaptiveConfig.floor", "must be in (0, 1]", self.floor)
        if self.retire_after is not None:
            _check(self.retire_after >= 1, "AdaptiveConfig.retire_after", "must be >= 1 or None",
                   self.retire_after)


@dataclass(frozen=True)
class BatchConfig:
    """Continuous batching of generation requests into the policy backend."""

    max_batch: int = 64
    """most requests in one `generate` call"""
    max_wait_s: float = 0.005
    """longest a request waits for others to join its batch (measured from its arrival)"""
    max_inflight: int = 1
    """`generate` calls at once: 1 for an in-process model, more for a server (vLLM, SGLang)"""
    retries: int = 2
    """re-tries of the failed part of a batch: the requests that got an error completion, or the
    whole batch when the `generate` call raised; then each still-failed request keeps an error
    completion (the episode records `infra_error` where='policy')"""
    retry_backoff_s: float = 0.5
    """delay before the first batch retry; doubles each time"""

    def __post_init__(self) -> None:
        _check(self.max_batch >= 1, "BatchConfig.max_batch", "must be >= 1", self.max_batch)
        _check(self.max_wait_s >= 0, "BatchConfig.max_wait_s", "must be >= 0", self.max_wait_s)
        _check(self.max_inflight >= 1, "BatchConfig.max_inflight", "must be >= 1", self.max_inflight)
        _check(self.retries >= 0, "BatchConfig.retries", "must be >= 0", self.retries)
        _check(self.retry_backoff_s >= 0, "BatchConfig.retry_backoff_s", "must be >= 0",
               self.retry_backoff_s)


@dataclass(frozen=True)
class SchedulerConfig:
    """What runs next, and how much of it."""

    group_size: int = 8
    """episodes per group (G of GRPO): the trainer consumes whole groups"""
    tiers: tuple[str, ...] = ("eval", "train", "background")
    """priority tiers, highest first. A slot that frees goes to the highest tier with work; running
    episodes are never interrupted (preemption happens at episode boundaries). A tier with endless
    work starves the tiers below it, by design: put endless work (training) below finite work."""
    trainer_tier: str = "train"
    """the tier whose groups the trainer takes: staleness-bounded and adaptively sampled"""
    max_running: int = 64
    """episodes in flight at once"""
    max_sandboxes: int | None = None
    """episodes of sandboxed domains (`DomainSpec.sandboxed`) in flight at once, so that live
    sandboxes never outgrow the workers however many episodes a workload has (an episode holds
    its sandbox between turns, while it waits for generation); None: the backend's capacity
    (its worker count)"""
    groups_per_step: int = 8
    """groups the trainer takes per policy update (the batch of the staleness rule)"""
    max_staleness: int | None = 1
    """policy versions a trainer sample may lag: 0 is synchronous RL, None is unbounded"""
    max_groups: int | None = None
    """stop drawing new trainer-tier groups after this many (a fixed workload); None: no end"""
    share_by: ShareBy = "samples"
    """what domain weights divide: 'samples' (episodes), or 'cost' (dominant-resource seconds:
    the larger of sandbox worker-seconds per worker slot and generator-seconds per generator slot)"""
    window_s: float = 600.0
    """length of the sliding window behind share caps and the per-domain share metrics"""
    starvation_s: float | None = 120.0
    """an eligible domain not served for this long goes next whatever its deficit (hard bound on
    waits on top of the fair share's own bound); None: fair share alone"""
    seed: int = 0
    """derives every group's task seed and every episode's seed (the same seed, the same work)"""
    retry: RetryConfig = field(default_factory=RetryConfig)
    """infrastructure-failure retries"""
    quarantine: QuarantineConfig = field(default_factory=QuarantineConfig)
    """per-domain infrastructure health"""
    adaptive: AdaptiveConfig = field(default_factory=AdaptiveConfig)
    """learning-signal–aware weights of the trainer tier"""
    batch: BatchConfig = field(default_factory=BatchConfig)
    """continuous batching of generation"""

    def __post_init__(self) -> None:
        _check(self.group_size >= 1, "SchedulerConfig.group_size", "must be >= 1", self.group_size)
        _check(len(self.tiers) >= 1 and len(set(self.tiers)) == len(self.tiers),
               "SchedulerConfig.tiers", "must be distinct names, at least one", self.tiers)
        _check(self.trainer_tier in self.tiers, "SchedulerConfig.trainer_tier",
               f"must be one of tiers {self.tiers}", self.trainer_tier)
        _check(self.max_running >= 1, "SchedulerConfig.max_running", "must be >= 1", self.max_running)
        if self.max_sandboxes is not None:
            _check(self.max_sandboxes >= 1, "SchedulerConfig.max_sandboxes", "must be >= 1 or None",
                   self.max_sandboxes)
        _check(self.groups_per_step >= 1, "SchedulerConfig.groups_per_step", "must be >= 1",
               self.groups_per_step)
        if self.max_staleness is not None:
            _check(self.max_staleness >= 0, "SchedulerConfig.max_staleness", "must be >= 0 or None",
                   self.max_staleness)
        if self.max_groups is not None:
            _check(self.max_groups >= 0, "SchedulerConfig.max_groups", "must be >= 0 or None",
                   self.max_groups)
        _check(self.share_by in ("samples", "cost"), "SchedulerConfig.share_by",
               "must be 'samples' or 'cost'", self.share_by)
        _check(self.window_s > 0, "SchedulerConfig.window_s", "must be > 0", self.window_s)
        if self.starvation_s is not None:
            _check(self.starvation_s > 0, "SchedulerConfig.starvation_s", "must be > 0 or None",
                   self.starvation_s)
