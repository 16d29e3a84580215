"""The FSDP2 trainer engine (2 processes, gloo on CPU, under torchrun) against the
single-process engine: same batches, same losses and gradient norms."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TORCHRUN = Path(sys.executable).with_name("torchrun")


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}


@pytest.mark.slow
def test_two_process_fsdp_matches_the_single_process_engine(tmp_path):
    from posttrain.training.engines.parity import compare

    if not TORCHRUN.exists():
        pytest.skip(f"no torchrun beside {sys.executable}")
    local, fsdp = tmp_path / "local.json", tmp_path / "fsdp.json"
    p = subprocess.run([sys.executable, "-m", "posttrain.training.engines.parity", "--engine", "local",
                        "--steps", "3", "--out", str(local)], capture_output=True, text=True, env=_env(),
                       timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    p = subprocess.run([str(TORCHRUN), "--nproc-per-node", "2", "-m", "posttrain.training.engines.parity",
                        "--engine", "fsdp", "--steps", "3", "--out", str(fsdp)], capture_output=True,
                       text=True, env=_env(), timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    a, b = json.loads(local.read_text()), json.loads(fsdp.read_text())
    assert [r["tokens"] for r in a] == [r["tokens"] for r in b]
    assert all(r["loss"] != 0 and r["grad_norm"] > 0 for r in a)
    # float32 sums in a different order: ~1e-6 relative; a real mismatch (a shard's gradient
    # lost or counted twice, the wrong loss share) is off by tens of percent
    assert compare(a, b) <= 1e-4


def test_micro_batches_split_the_step_evenly_over_ranks():
    from posttrain.training.engines.fsdp import FSDPEngine

    engine = FSDPEngine.__new__(FSDPEngine)  # only the split: no process group needed
    engine.world = 2
    ranges = {}
    for rank in (0, 1):
        engine.rank = rank
        ranges[rank] = engine.micro_batches([3] * 7, 2)
    assert len(ranges[0]) == len(ranges[1])  # the same number of forwards on every rank
    covered = sorted(i for r in ranges.values() for lo, hi in r for i in range(lo, hi))
    assert covered == list(range(7))
    engine.rank = 0
    assert engine.micro_batches([5], 4) == [(0, 0)]  # no sample left: a placeholder forward
    engine.rank = 1
    assert engine.micro_batches([5], 4) == [(0, 1)]
    # by tokens: rank 0's short samples make one micro-batch, rank 1's long ones three
    engine.rank = 0
    assert engine.micro_batches([2, 2, 2, 9, 9, 9], 8, tokens=10) == [(0, 3), (3, 3), (3, 3)]


@pytest.mark.slow
def test_token_bounded_micro_batches_change_memory_not_the_result():
    from posttrain.training.engines.base import split

    assert split([4, 4, 4, 12, 1, 1], 0, 6, size=8, tokens=9) == [(0, 2), (2, 3), (3, 4), (4, 6)]
    assert split([4, 4, 4], 0, 3, size=2) == [(0, 2), (2, 3)]
    from posttrain.training.engines.parity import run

    by_count, by_tokens = run("local", 1, micro_batch_size=64), run("local", 1, micro_batch_size=64,
                                                                    micro_batch_tokens=24)
    assert by_tokens[0]["micro_batches"] > by_count[0]["micro_batches"] == 1
    assert by_tokens[0]["loss"] == pytest.approx(by_count[0]["loss"], rel=1e-4)
    assert by_tokens[0]["grad_norm"] == pytest.approx(by_count[0]["grad_norm"], rel=1e-4)


def test_fsdp_outside_torchrun_says_how_to_start_it(monkeypatch):
    from posttrain.training.engines.fsdp import init_distributed

    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(RuntimeError, match="torchrun"):
        init_distributed("cpu")
