"""The Ray backend against a local Ray instance started here: the same results as the local
backend on the same seed. Loopback only: Ray's own address discovery is switched to 127.0.0.1
and its usage reporting off before it is imported."""

import asyncio
import os

import pytest

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # node address: 127.0.0.1

ray = pytest.importorskip("ray", reason="Ray is in the test extra; installed on CI")

from posttrain.scheduling import (  # noqa: E402
    AdaptiveConfig,
    BatchConfig,
    DomainSpec,
    RetryConfig,
    Scheduler,
    SchedulerConfig,
)
from posttrain.scheduling.ray_backend import RayBackend  # noqa: E402
from posttrain.scheduling.sim import SimFactory, SimGenerator, make_domains  # noqa: E402

DOMAINS = make_domains(6, seed=9, step_range=(0.001, 0.01), failure_rate=0.15, turns=(1, 3))
CONFIG = SchedulerConfig(group_size=3, max_running=24, groups_per_step=3, max_staleness=2, max_groups=12,
                         tiers=("train",), seed=5, adaptive=AdaptiveConfig(enabled=False),
                         retry=RetryConfig(max_retries=2, backoff_s=0.005, backoff_max_s=0.02),
                         batch=BatchConfig(max_batch=16, max_wait_s=0.002))


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


def run(backend_name: str) -> tuple[dict, list, dict]:
    factory = SimFactory(DOMAINS)
    failures: list = []

    async def main():
        backend = RayBackend(factory, num_workers=2, concurrency=8) if backend_name == "ray" else None
        sched = Scheduler(CONFIG, [DomainSpec(d.name, weight=1 + i % 2) for i, d in enumerate(DOMAINS)],
                          SimGenerator(2e6, call_s=0.001), factory=factory, backend=backend, workers=16,
                          on_failure=lambda r: failures.append(r.trajectory))
        groups = []
        async with sched:
            while batch := await sched.take(3):
                groups += batch
                sched.set_policy_version(f"v{len(groups)}")
            return groups, sched.metrics()

    groups, metrics = asyncio.run(main())
    result = {g.group_id: [(t.attempt, t.status, t.reward, t.seed) for t in g.trajectories] for g in groups}
    failed = sorted((f.group_id, f.attempt, f.seed) for f in failures)
    return result, failed, metrics


def test_ray_backend_needs_ray_started_first():
    # first in this file: the module's Ray instance starts with the next test
    assert not ray.is_initialized()
    with pytest.raises(RuntimeError, match="ray.init"):
        RayBackend(SimFactory(DOMAINS)).open()


@pytest.mark.slow
def test_ray_backend_gives_the_same_results_as_local(local_ray):
    local, local_failed, _ = run("local")
    remote, remote_failed, m = run("ray")
    assert m["backend"]["name"] == "ray" and m["backend"]["capacity"] == 16
    assert remote == local
    assert remote_failed == local_failed and local_failed  # the same injected failures, retried alike
    assert m["lost"] == 0 and m["worker_utilization"] > 0
