"""`posttrain run` under `torchrun --nproc-per-node 2` (FSDP2, gloo on CPU) against one process:
the same steps, one writer, and a resume on every rank."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TORCHRUN = Path(sys.executable).with_name("torchrun")

CONFIG = """
name = "{name}"
runs_dir = "{runs}"
steps = {steps}
checkpoint_every = 2
[domains]
train = ["math.add.d2", "text.reverse.l3"]
[rollout]
group_size = 4
groups_per_step = 4
[eval]
tasks_per_domain = 2
samples = 1
[model]
threads = 1
[trainer]
lr = 1e-4
ppo_epochs = 2
kl_beta = 0.05
engine = "{engine}"
"""


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}


def _config(tmp_path: Path, name: str, engine: str, steps: int) -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(CONFIG.format(name=name, runs=tmp_path / "runs", steps=steps, engine=engine))
    return path


def _rows(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def _trajectories(run: Path, name: str) -> list:
    from posttrain.storage.store import Store

    with Store.for_run_dir(run, readonly=True) as store:
        return list(store.trajectories(run_id=name))


@pytest.mark.slow
def test_posttrain_run_under_torchrun_matches_one_process_and_resumes(tmp_path):
    if not TORCHRUN.exists():
        pytest.skip(f"no torchrun beside {sys.executable}")
    local = subprocess.run([sys.executable, "-m", "posttrain.cli", "run",
                            str(_config(tmp_path, "one", "local", 3)), "--json"],
                           capture_output=True, text=True, env=_env(), cwd=ROOT, timeout=900)
    assert local.returncode == 0, local.stderr[-3000:] + local.stdout[-2000:]
    # two steps, then the finished run resumed for a third: every rank loads the checkpoint
    # (weights, full optimizer state, reference), so step 3 is the one-process run's step 3
    cfg = _config(tmp_path, "two", "fsdp", 2)
    logs = tmp_path / "logs"
    torchrun = [str(TORCHRUN), "--nproc-per-node", "2", "--log-dir", str(logs), "--redirects", "1:3",
                "-m", "posttrain.cli", "run", str(cfg), "--json"]
    for extra in ([], ["--resume", "--steps", "3"]):
        p = subprocess.run(torchrun + extra, capture_output=True, text=True, env=_env(), cwd=ROOT, timeout=900)
        assert p.returncode == 0, p.stderr[-3000:] + p.stdout[-2000:]
    assert json.loads(p.stdout.strip().splitlines()[-1])["steps_done"] == 3

    one, two = _rows(tmp_path / "runs" / "one"), _rows(tmp_path / "runs" / "two")
    assert [r["step"] for r in two] == [1, 2, 3]  # one writer: no step twice
    for a, b in zip(one, two, strict=True):
        # the same groups (sampled with the same seeds from weights equal to ~1e-6: no token flips)
        assert (a["reward_mean"], a["tokens"], a["samples"]) == (b["reward_mean"], b["tokens"], b["samples"])
        # float32 sums in another order (the gradient all-reduce, the sharded clipping norm)
        # differ by ~1e-6 relative after three steps; a lost or doubled shard, a wrong loss
        # share or an optimizer state not restored on resume is off by percents
        for key in ("loss", "grad_norm", "kl", "entropy"):
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), (a["step"], key)
    assert two[0]["loss"] != 0 and two[0]["grad_norm"] > 0

    trajs = _trajectories(tmp_path / "runs" / "two", "two")
    ids = [t.id for t in trajs]
    assert len(ids) == len(set(ids)) == len(_trajectories(tmp_path / "runs" / "one", "one"))
    # the checkpoint's optimizer state is the full one, by parameter name (any world size reads it)
    import torch

    state = torch.load(tmp_path / "runs" / "two" / "checkpoints" / "step-3" / "optimizer.pt", weights_only=True)
    assert state["state"] and all(isinstance(k, str) for k in state["state"])
    assert (tmp_path / "runs" / "two" / "checkpoints" / "step-3" / "reference" / "model.safetensors").exists()
    # rank 1 printed nothing (its streams went to files)
    outputs = list(logs.rglob("*.log"))
    assert outputs and all(f.read_text() == "" for f in outputs), {f.name: f.read_text()[-500:] for f in outputs}


def test_torchrun_with_the_local_engine_is_refused(tmp_path, monkeypatch):
    from posttrain.pipeline.config import ConfigError, load_config
    from posttrain.pipeline.main import Job

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    job = Job(load_config(_config(tmp_path, "bad", "local", 1)))
    with pytest.raises(ConfigError, match="engine = \"fsdp\""):
        job.make_trainer()
