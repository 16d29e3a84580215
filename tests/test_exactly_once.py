"""Exactly-once runs: a resumed run repeats the uninterrupted one step for step, and nothing a
resume writes again is stored twice (trajectories, metrics lines, checkpoints)."""

import json
import os

import pytest
from rich.console import Console

from posttrain.pipeline.config import load_config
from posttrain.pipeline.main import Job
from posttrain.pipeline.metrics import MetricsLog
from posttrain.storage.store import Store
from posttrain.training.resume import RunCheckpoints, advance_recorded_failures
from posttrain.values.trajectory import ErrorInfo, Trajectory
from tests.test_pipeline import SMOKE


def _job(tmp_path, name, steps):
    # old log-probs recomputed by the trainer: the sampler's come from batches that continuous
    # batching forms by timing, which moves the weights by float noise in any two runs (Adam
    # scales tiny gradient differences up); recomputed ones make the weights bit-for-bit comparable
    path = tmp_path / f"{name}.toml"
    path.write_text(SMOKE.format(name=name, runs=tmp_path / "runs", steps=steps)
                    .replace("checkpoint_every = 2", "checkpoint_every = 2\nkeep_checkpoints = 10")
                    .replace("lr = 1e-4", 'lr = 1e-4\nold_logprobs = "recompute"'))
    return Job(load_config(path), Console(file=open(os.devnull, "w")))


def _rows(run_dir):
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _rewards(run_dir):
    return [{k: v for k, v in r.items() if k == "step" or k.endswith("reward") or k.endswith("pass_rate")}
            for r in _rows(run_dir)]


@pytest.mark.slow
def test_resuming_a_checkpoint_repeats_the_uninterrupted_run(tmp_path):
    # Before the fix the groups in flight at the checkpoint were re-run at attempt + 1 (other
    # sampling seeds), so step 3 differed from the uninterrupted run, and the extended run kept
    # the first run's `after` evaluation of the step-2 weights.
    # (8 steps: from step 6 on the adaptive weights move, and a resume must restore them too)
    full = _job(tmp_path, "full", 8).run()
    _job(tmp_path, "part", 4).run()
    resumed = _job(tmp_path, "part", 8).run()  # the finished 4-step run, resumed to 8 steps
    runs = tmp_path / "runs"
    assert _rewards(runs / "part") == _rewards(runs / "full")
    for key in ("final_pass1", "final_pass2", "heldout_final_pass1"):
        assert resumed[key] == full[key], key
    from safetensors.torch import load_file

    a, b = (load_file(runs / run / "checkpoints" / "step-8" / "model.safetensors") for run in ("full", "part"))
    assert all(bool((a[k] == b[k]).all()) for k in a)
    for run in ("full", "part"):
        with Store.for_run_dir(runs / run, readonly=True) as store:
            assert sum(store.duplicates().values()) == 0
            assert store.counts("eval:after")["episodes"] == 3 * 4 * 2  # one evaluation, of the final weights


def _traj(group, member, attempt, status="completed", **kw):
    extra = ({"error": ErrorInfo(type="X", message="boom", where="sandbox")} if status == "infra_error"
             else {"reward": 1.0})
    return Trajectory(task_key="k", task_hash="h", domain="d", split="train", policy_version="v",
                      status=status, group_id=group, member=member, attempt=attempt, run_id="r",
                      **extra, **kw)


def test_the_store_keeps_one_trajectory_per_identity(tmp_path):
    with Store(tmp_path / "s.sqlite") as store:
        store.put_trajectories([(_traj("g", 0, 0), None, None), (_traj("g", 1, 0), None, None)])
        # a resumed run writes them again
        store.put_trajectories([(_traj("g", 0, 0), None, None), (_traj("g", 1, 0), None, None)])
        assert store.counts("r")["episodes"] == 2
        store.put_trajectory(_traj("g", 2, 0, "infra_error"))
        store.put_trajectory(_traj("g", 2, 0, "infra_error"))
        assert store.counts("r")["infra_error"] == 1
        store.put_trajectory(_traj("g", 2, 0))  # re-run after the resume, and this time it worked
        assert store.counts("r") == {**store.counts("r"), "episodes": 3, "infra_error": 0}
        store.put_trajectory(_traj("g", 2, 0, "infra_error"))  # never replaces a kept sample
        assert store.counts("r")["infra_error"] == 0
        store.put_trajectory(_traj("g", 2, 1))  # another attempt is another identity
        assert store.counts("r")["episodes"] == 4 and sum(store.duplicates().values()) == 0
        assert store.infra_attempts("r") == {}
        store.put_trajectory(_traj("h", 1, 3, "infra_error"))
        assert store.infra_attempts("r") == {("h", 1): 3}


def test_a_schema_1_store_is_migrated(tmp_path):
    import sqlite3

    path = tmp_path / "old.sqlite"
    with Store(path) as store:
        store.put_trajectory(_traj("g", 0, 0))
    db = sqlite3.connect(path)  # make it look like schema 1: no member column, no identity index
    db.executescript("DROP INDEX traj_identity; ALTER TABLE trajectories DROP COLUMN member; "
                     "UPDATE meta SET value='1' WHERE key='schema_version';")
    db.close()
    with Store(path) as store:
        assert [t.member for t in store.trajectories()] == [0]
        store.put_trajectory(_traj("g", 0, 0))
        assert store.counts()["episodes"] == 1


def test_failures_stored_after_the_save_move_their_member_on():
    state = {"groups": [{"gid": "d#1", "size": 2, "attempts": [0, 1], "retries": [0, 1],
                         "launched": [True, True]}]}
    out = advance_recorded_failures(state, {("d#1", 0): 0, ("d#1", 1): 0})
    g = out["groups"][0]
    assert g["attempts"] == [1, 1] and g["retries"] == [1, 1] and g["launched"] == [False, True]
    assert state["groups"][0]["attempts"] == [0, 1]  # the saved state itself is untouched


def test_metrics_log_cuts_a_torn_tail_and_steps_past_the_checkpoint(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s, "r": s / 10}) + "\n" for s in (1, 2, 3)) + '{"step": 4, "r')
    log = MetricsLog(path)
    assert log.resume(2) == 2  # step 3 (after the checkpoint) and the torn step-4 line
    assert [json.loads(x)["step"] for x in path.read_text().splitlines()] == [1, 2]
    assert not log.write({"step": 2, "r": 9}) and log.write({"step": 3, "r": 0.3})
    assert [json.loads(x)["step"] for x in path.read_text().splitlines()] == [1, 2, 3]


def test_interrupted_checkpoint_directories_are_removed(tmp_path):
    ckpts = tmp_path / "checkpoints"
    for name in ("step-2", ".step-4.tmp-1a2b3c4d", ".step-2.old-deadbeef"):
        (ckpts / name).mkdir(parents=True)
        (ckpts / name / "model.safetensors").write_bytes(b"x")
    removed = RunCheckpoints(ckpts, keep=3).clean_interrupted()
    assert sorted(p.name for p in removed) == [".step-2.old-deadbeef", ".step-4.tmp-1a2b3c4d"]
    assert [p.name for p in ckpts.iterdir()] == ["step-2"]


def test_the_publisher_refuses_a_scheduler_out_of_step(tmp_path):
    from posttrain.training.config import TrainerConfig
    from posttrain.training.publish import PolicyPublisher, VersionMismatch
    from posttrain.training.trainer import Trainer
    from tests.test_pipeline import ROOT

    trainer = Trainer(ROOT / "models" / "tiny-base", TrainerConfig(run_name="p"))
    publisher = PolicyPublisher(trainer, copy=False)
    seen = []
    publisher.subscribe(lambda name: seen.append(name) or len(seen))
    trainer.step_count = 1  # as after one step (the weights are the same: no training needed here)
    assert publisher.publish().name == "p/step-1" and publisher.version.name == "p/step-1"
    publisher.subscribe(lambda name: 7)
    trainer.step_count = 2
    with pytest.raises(VersionMismatch, match="p/step-2"):
        publisher.publish()


@pytest.mark.parametrize("staleness, warned", [(0, False), (1, True)])
def test_resuming_an_asynchronous_run_says_it_is_not_exact(tmp_path, staleness, warned):
    from posttrain.training.trainer import Trainer

    path = tmp_path / "s.toml"
    path.write_text(SMOKE.format(name="s", runs=tmp_path / "runs", steps=4)
                    .replace("[trainer]", f"[scheduler]\nmax_staleness = {staleness}\n[trainer]"))
    job = Job(load_config(path), Console(file=open(os.devnull, "w")))
    assert job.config.scheduler.max_staleness == staleness
    trainer = Trainer(job.config.model.path, job.trainer_config)
    trainer.step_count = 2  # as after two steps (the weights need no training for this)
    job.checkpoints.save(trainer, {})
    resumed, _ = job.make_trainer()
    assert resumed.step_count == 2
    assert bool(job.warnings) == warned
    if warned:
        assert job.warnings == ["resumed at step 2 with scheduler.max_staleness = 1: not exactly resumable "
                                "(which samples overlap which update depends on timing); steps after the "
                                "checkpoint differ from the interrupted run's"]
