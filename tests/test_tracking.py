"""Experiment tracking: the job's scalars reach TensorBoard (read back with tensorboard's own
EventAccumulator), W&B offline and an MLflow file store (each when its library is installed)."""

import importlib.util
import json
import os
import time
from pathlib import Path

import pytest

from posttrain.tracking import LoggingConfig, TrackingError, eval_scalars, flatten, open_tracker

ROW = {"step": 3, "time": 1.7e9, "loss": 0.25, "kl": 0.01, "reward_mean": 0.5, "domain/data.qa/reward": 0.5,
       "domain/math.add.d1/reward": None, "sched/generator_busy": 0.9, "sched/quarantined": ["x.y"],
       "sched/domains": {"data.qa": {"quota": 0.5, "samples": 16}}, "ok": True, "nan": float("nan")}


def test_flatten_keeps_every_number():
    flat = flatten(ROW)
    assert flat == {"loss": 0.25, "kl": 0.01, "reward_mean": 0.5, "domain/data.qa/reward": 0.5,
                    "sched/generator_busy": 0.9, "sched/quarantined/count": 1.0,
                    "sched/domains/data.qa/quota": 0.5, "sched/domains/data.qa/samples": 16.0, "ok": 1.0}


def test_eval_scalars():
    summary = {"domains": {"data.qa": {"pass@1": {"value": 0.4, "ci": [0.1, 0.7]}, "pass@8": {"value": 0.9},
                                       "infra_error_rate": 0.0, "truncation_rate": 0.1}},
               "families": {"data": {"macro_pass1": 0.4}}}
    assert eval_scalars(summary, "before") == {
        "eval/before/data.qa/pass@1": 0.4, "eval/before/data.qa/pass@8": 0.9,
        "eval/before/data.qa/infra_error_rate": 0.0, "eval/before/data.qa/truncation_rate": 0.1,
        "eval/before/family/data/macro_pass1": 0.4}


def read_tensorboard(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_tensorboard_is_the_default(tmp_path):
    tracker = open_tracker(LoggingConfig(), tmp_path, "r")
    for step in (1, 2, 3):
        tracker.log(step, flatten({**ROW, "loss": 1.0 / step}))
    tracker.close()
    got = read_tensorboard(tmp_path / "tensorboard")
    assert set(got) == set(flatten(ROW))
    assert [s for s, _ in got["loss"]] == [1, 2, 3]
    assert got["loss"][2][1] == pytest.approx(1 / 3)
    assert got["sched/domains/data.qa/samples"] == [(1, 16.0), (2, 16.0), (3, 16.0)]


def test_no_backends_is_no_tracking(tmp_path):
    tracker = open_tracker(LoggingConfig(backends=[]), tmp_path, "r")
    tracker.log(1, {"loss": 1.0})
    tracker.close()
    assert list(tmp_path.iterdir()) == []


def test_a_backend_whose_library_is_missing_is_a_clear_error(tmp_path):
    missing = next((b for b in ("trackio", "wandb", "mlflow") if importlib.util.find_spec(b) is None), None)
    if missing is None:
        pytest.skip("every tracker library is installed")
    with pytest.raises(TrackingError, match=f"names '{missing}', but '{missing}' is not installed"):
        open_tracker(LoggingConfig(backends=["tensorboard", missing]), tmp_path, "r")


def test_unknown_backend_is_a_config_error():
    from posttrain.pipeline.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="logging.backends.0"):
        load_config(None, {"logging.backends": ["neptune"]})


def _wandb_records(raw: bytes):
    """The records of a W&B transaction log (.wandb): a 7-byte W&B header, then LevelDB's log
    format (32 KiB blocks of records with a 7-byte header: crc32, length, type 1 full / 2 first /
    3 middle / 4 last). The wandb package reads these files in its Go core only, so the test
    reads them here to look at what the offline run recorded."""
    import struct

    assert raw[:4] == b":W&B"
    pos, block, parts = 7, 32768, b""
    while pos + 7 <= len(raw):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", raw[pos:pos + 7])
        if kind == 0:
            break
        data, pos = raw[pos + 7:pos + 7 + length], pos + 7 + length
        if kind == 1:
            yield data
        elif kind == 2:
            parts = data
        elif kind == 3:
            parts += data
        elif kind == 4:
            yield parts + data


def test_wandb_offline(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_SILENT", "true")
    tracker = open_tracker(LoggingConfig(backends=["wandb"]), tmp_path, "r", {"steps": 3})
    for step in (1, 2):
        tracker.log(step, {"loss": float(step), "domain/data.qa/reward": 0.5})
    tracker.close()
    [run_file] = list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    from wandb.proto import wandb_internal_pb2

    def history():
        out, ended = [], False
        for data in _wandb_records(run_file.read_bytes()):
            rec = wandb_internal_pb2.Record()
            rec.ParseFromString(data)
            kind = rec.WhichOneof("record_type")
            ended |= kind == "exit"
            if kind == "history":
                out.append({i.key or "/".join(i.nested_key): i.value_json for i in rec.history.item})
        return out, ended

    # wandb's core process may still be writing the file when finish() returns
    deadline = time.monotonic() + 30
    while not (found := history())[1] and time.monotonic() < deadline:
        time.sleep(0.2)
    history, _ = found
    assert [float(h["loss"]) for h in history] == [1.0, 2.0]
    assert [int(h["_step"]) for h in history] == [1, 2]
    assert all(float(h["domain/data.qa/reward"]) == 0.5 for h in history)


def test_mlflow_file_store(tmp_path):
    pytest.importorskip("mlflow")
    tracker = open_tracker(LoggingConfig(backends=["mlflow"], project="p"), tmp_path, "r", {"steps": 3})
    for step in (1, 2):
        tracker.log(step, {"loss": float(step), "eval/before/data.qa/pass@1": 0.25})
    tracker.close()
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=(tmp_path / "mlruns").resolve().as_uri())
    [run] = client.search_runs([client.get_experiment_by_name("p").experiment_id])
    assert run.info.run_name == "r" and run.info.status == "FINISHED"
    assert sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, "loss")) == [(1, 1.0), (2, 2.0)]
    assert run.data.metrics["eval/before/data.qa/pass_1"] == 0.25


@pytest.mark.slow
def test_trackio_local_store(tmp_path):
    """trackio keeps a project's runs in a SQLite file under TRACKIO_DIR, read once at import:
    the run is made and read back in a fresh process pointed at this test's directory."""
    pytest.importorskip("trackio")
    import subprocess
    import sys

    code = """
import json, sys
from pathlib import Path
from posttrain.tracking import LoggingConfig, open_tracker
tracker = open_tracker(LoggingConfig(backends=["trackio"], project="p"), Path(sys.argv[1]), "r", {"steps": 3})
for step in (1, 2):
    tracker.log(step, {"loss": float(step), "domain/data.qa/reward": 0.5})
tracker.close()
from trackio.sqlite_storage import SQLiteStorage
print(json.dumps({"runs": SQLiteStorage.get_runs("p"), "logs": SQLiteStorage.get_logs("p", "r")}))
"""
    env = {**os.environ, "TRACKIO_DIR": str(tmp_path / "trackio")}
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "run")], env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["runs"] == ["r"]
    assert [(log["step"], log["loss"], log["domain/data.qa/reward"]) for log in out["logs"]] == [(1, 1.0, 0.5),
                                                                                                 (2, 2.0, 0.5)]
    assert (tmp_path / "trackio" / "p.db").exists()
