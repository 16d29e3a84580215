"""Typed settings of the scheduler, one small settings class per concern.

Every field has a docstring under it (CleanRL style); pydantic checks the types (`posttrain.settings`)
and each class's `_rules` the values, naming the field and the value it rejects. `SchedulerConfig`
and its parts are the `[scheduler]` section of a run config (`posttrain.pipeline.config`).
"""

from __future__ import annotations

from dataclasses import field
from typing import Literal

from pydantic import model_validator

from posttrain.settings import check, settings

ShareBy = Literal["samples", "cost", "tokens"]


@settings
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
    max_samples: int | None = None
    """absolute budget: once this many of its samples are in completed groups, the domain is
    retired for the rest of the run (reported as budget-exhausted); groups already admitted still
    finish, so it ends at most the groups in flight over. None: no budget"""
    max_tokens: int | None = None
    """absolute budget of generated tokens (every episode of the domain, failed ones included),
    retired in the same way; None: no budget"""
    max_sandbox_s: float | None = None
    """absolute budget of sandbox worker-seconds, retired in the same way; None: no budget"""
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

    @model_validator(mode="after")
    def _rules(self) -> DomainSpec:
        check(bool(self.name), "DomainSpec", "name", "must be non-empty", self.name)
        owner = f"DomainSpec {self.name!r}"
        check(self.weight > 0, owner, "weight", "must be > 0", self.weight)
        if self.max_concurrency is not None:
            check(self.max_concurrency >= 1, owner, "max_concurrency", "must be >= 1 or None", self.max_concurrency)
        for name in ("max_sample_share", "max_cost_share"):
            value = getattr(self, name)
            if value is not None:
                check(0 < value <= 1, owner, name, "must be in (0, 1] or None", value)
        if self.group_size is not None:
            check(self.group_size >= 1, owner, "group_size", "must be >= 1 or None", self.group_size)
        for name in ("max_samples", "max_tokens", "max_sandbox_s"):
            value = getattr(self, name)
            if value is not None:
                check(value > 0, owner, name, "must be > 0 or None", value)
        check(not (self.light and self.sandboxed), owner, "light", "cannot be set on a sandboxed domain", self.light)
        return self


@settings
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

    @model_validator(mode="after")
    def _rules(self) -> RetryConfig:
        check(self.max_retries >= 0, self, "max_retries", "must be >= 0")
        check(self.backoff_s >= 0, self, "backoff_s", "must be >= 0")
        check(self.backoff_max_s >= self.backoff_s, self, "backoff_max_s", "must be >= backoff_s")
        check(self.jitter >= 0, self, "jitter", "must be >= 0")
        for name in ("policy_outage_s", "episode_timeout_s"):
            check(getattr(self, name) is None or getattr(self, name) > 0, self, name, "must be > 0 or None")
        return self
@settings
class QuarantineConfig:
    """When a domain's infrastructure is judged broken. Policy-backend errors do not count."""

    window: int = 50
    """the last this many episodes of a domain are looked at"""
    min_episodes: int = 20
    """no verdict before this many episodes are in the window"""
    max_error_rate: float = 0.5
    """a domain whose infra-error rate in the window exceeds this is quarantined"""

    @model_validator(mode="after")
    def _rules(self) -> QuarantineConfig:
        check(self.window >= 1, self, "window", "must be >= 1")
        check(1 <= self.min_episodes <= self.window, self, "min_episodes", "must be in [1, window]")
        check(0 < self.max_error_rate <= 1, self, "max_error_rate", "must be in (0, 1]")
        return self
@settings
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
    prior_groups: int = 0
    """how many groups of each trained domain's window the base evaluation (`posttrain run`'s
    `evals/before.json`) stands for, until real groups push it out: a domain's weight starts at
    the share of groups it is expected to give with a reward spread (from each eval task's pass
    rate), so the first steps already favour the domains with signal instead of spending a pass
    over every domain to find them. 0: no prior, every domain starts at its configured weight"""

    @model_validator(mode="after")
    def _rules(self) -> AdaptiveConfig:
        check(self.window >= 1, self, "window", "must be >= 1")
        check(1 <= self.min_groups <= self.window, self, "min_groups", "must be in [1, window]")
        check(0 < self.floor <= 1, self, "floor", "must be in (0, 1]")
        check(self.retire_after is None or self.retire_after >= 1, self, "retire_after", "must be >= 1 or None")
        check(0 <= self.prior_groups <= self.window, self, "prior_groups", "must be in [0, window]")
        return self
@settings
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

    @model_validator(mode="after")
    def _rules(self) -> BatchConfig:
        check(self.max_batch >= 1, self, "max_batch", "must be >= 1")
        check(self.max_wait_s >= 0, self, "max_wait_s", "must be >= 0")
        check(self.max_inflight >= 1, self, "max_inflight", "must be >= 1")
        check(self.retries >= 0, self, "retries", "must be >= 0")
        check(self.retry_backoff_s >= 0, self, "retry_backoff_s", "must be >= 0")
        return self
@settings
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
    """what domain weights divide: 'samples' (episodes), 'cost' (dominant-resource seconds: the
    larger of sandbox worker-seconds per worker slot and generator-seconds per generator slot), or
    'tokens' (generated tokens). Cost and tokens are estimated at admission (the domain's running
    average per group) and corrected by what the group really used when it completes"""
    window_s: float = 600.0
    """length of the sliding window behind share caps and the per-domain share metrics"""
    starvation_s: float | None = 120.0
    """an eligible domain not served for this long goes next whatever its deficit (hard bound on
    waits on top of the fair share's own bound); None: fair share alone"""
    starvation_share: float = 0.1
    """the largest share of a tier's groups the starvation guard may give out of turn: where the
    bound cannot be kept for every domain (more domains than the tier serves in `starvation_s`)
    the guard serves the longest waits within this share and the weights decide the rest, instead
    of the guard overriding the weights for every group; 1.0: no limit"""
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

    @model_validator(mode="after")
    def _rules(self) -> SchedulerConfig:
        check(self.group_size >= 1, self, "group_size", "must be >= 1")
        check(len(self.tiers) >= 1 and len(set(self.tiers)) == len(self.tiers), self, "tiers",
              "must be distinct names, at least one")
        check(self.trainer_tier in self.tiers, self, "trainer_tier", f"must be one of tiers {self.tiers}")
        check(self.max_running >= 1, self, "max_running", "must be >= 1")
        check(self.max_sandboxes is None or self.max_sandboxes >= 1, self, "max_sandboxes", "must be >= 1 or None")
        check(self.groups_per_step >= 1, self, "groups_per_step", "must be >= 1")
        check(self.max_staleness is None or self.max_staleness >= 0, self, "max_staleness", "must be >= 0 or None")
        check(self.max_groups is None or self.max_groups >= 0, self, "max_groups", "must be >= 0 or None")
        check(self.window_s > 0, self, "window_s", "must be > 0")
        check(self.starvation_s is None or self.starvation_s > 0, self, "starvation_s", "must be > 0 or None")
        check(0 < self.starvation_share <= 1, self, "starvation_share", "must be in (0, 1]")
        return self
