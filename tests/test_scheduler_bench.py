"""benchmarks/scheduler.py's pieces still run against the scheduler's current types (its
synchronous baseline and the core-overhead loop had rotted: they built episode specs and results
of an older shape, and the benchmark died after its first section)."""

import math
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench(load_benchmark):
    return load_benchmark("scheduler")


def test_the_core_overhead_loop_runs_and_keeps_the_cost_shares(bench):
    out = bench.core_overhead(n_domains=40, groups=800)
    assert out["groups"] >= 800 and out["decisions"] > 0
    assert math.isfinite(out["us_per_episode"])
    assert out["quota_share_gap_max"] < 0.05


def test_the_synchronous_baseline_runs_every_member_and_retries_the_failed(bench, monkeypatch):
    monkeypatch.setattr(bench, "TIME_SCALE", 0.001)
    domains, _, config = bench.workload()
    admitted = [(d.name, 0) for d in domains[:6]]
    wall, out = bench.run_sync(domains, config, admitted)
    members = 6 * bench.GROUP_SIZE
    # every member ran; a failed one re-ran until kept or out of retries (its group then dropped)
    assert out["kept"] + out["failed"] >= members
    assert members - out["dropped_groups"] * bench.GROUP_SIZE <= out["kept"] <= members
    assert wall > 0 and out["gen_s"] > 0
