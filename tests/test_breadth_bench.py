"""benchmarks/breadth.py's own arithmetic: the null delta of sampling noise, and resuming a run
with the flags it started with."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("breadth_bench", ROOT / "benchmarks" / "breadth.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def record(domain: str, outcomes: list[bool | None]):
    samples = {j: SimpleNamespace(scored=p is not None, passed=p) for j, p in enumerate(outcomes)}
    return SimpleNamespace(domain=domain, by_index=lambda: samples)


def test_null_delta_is_odd_minus_even_samples_per_task_scaled_to_the_whole_evaluation(bench):
    before = SimpleNamespace(records=[
        # odd samples all pass, even ones all fail: +1 on this task
        record("a", [False, True, False, True]),
        # the same on both sides: 0
        record("a", [True, True, False, False]),
        # an unscored (infrastructure) sample is left out of its side: odd 1/1, even 1/2
        record("b", [True, None, False, True]),
        # not asked for
        record("c", [False, True]),
    ])
    null = bench.null_deltas(before, ["a", "b"])
    assert set(null) == {"a", "b"}
    assert null["a"] == pytest.approx(0.5 / 2 ** 0.5)
    assert null["b"] == pytest.approx(0.5 / 2 ** 0.5)


def test_a_resume_must_repeat_the_flags_it_started_with(bench, tmp_path):
    path = tmp_path / "run" / "bench-segments.json"
    flags = {"steps": 40, "samples": 8, "resume": False}
    fresh = bench._load_segments(path, flags)
    assert fresh == {"flags": {"steps": 40, "samples": 8}, "segments": []}
    with bench._Segment(path, fresh):
        pass
    with bench._Segment(path, bench._load_segments(path, {**flags, "resume": True})):
        pass
    stored = json.loads(path.read_text())
    assert len(stored["segments"]) == 2 and all(s["wall_s"] >= 0 for s in stored["segments"])
    with pytest.raises(SystemExit, match="steps"):
        bench._load_segments(path, {**flags, "steps": 41, "resume": True})
