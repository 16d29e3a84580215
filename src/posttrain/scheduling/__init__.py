"""The scheduler: what runs next, where, and what the trainer gets.

* `SchedulerCore` (core.py): every decision, synchronous and clock-injected — tiers, weighted fair
  share over samples or cost (quotas.py), concurrency limits, retries, quarantine and adaptive
  sampling (health.py), the staleness bound (staleness.py), state save/restore (state.py).
* `Scheduler` (runner.py): runs the core's decisions with asyncio, a worker backend
  (backends.py: local threads; ray_backend.py: Ray actors) and continuous batching of generation
  (batcher.py).
* episodes.py adapts `posttrain.rollout.episode.Episode`; sim.py is the simulated workload.

Ray is imported only when a `RayBackend` is opened.
"""

from posttrain.scheduling.backends import LocalBackend, WorkerBackend
from posttrain.scheduling.batcher import GenerationBatcher
from posttrain.scheduling.config import (
    AdaptiveConfig,
    BatchConfig,
    DomainSpec,
    QuarantineConfig,
    RetryConfig,
    SchedulerConfig,
)
from posttrain.scheduling.core import SchedulerCore
from posttrain.scheduling.runner import EpisodeTimeout, Scheduler, SchedulerStalled
from posttrain.scheduling.staleness import StalenessController
from posttrain.scheduling.work import EpisodeDriver, EpisodeFactory, EpisodeSpec, Group, Usage

__all__ = [
    "AdaptiveConfig", "BatchConfig", "DomainSpec", "EpisodeDriver", "EpisodeFactory", "EpisodeSpec",
    "EpisodeTimeout", "GenerationBatcher", "Group", "LocalBackend", "QuarantineConfig", "RetryConfig",
    "Scheduler", "SchedulerConfig", "SchedulerCore", "SchedulerStalled", "StalenessController", "Usage",
    "WorkerBackend",
]
