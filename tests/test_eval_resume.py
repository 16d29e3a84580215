"""An evaluation cut short by a kill continues where it stopped: no sample is generated twice,
and the figures equal the uninterrupted evaluation's."""

import os
import shutil
import sqlite3

import pytest
from rich.console import Console

from posttrain.evaluation import EvalConfig, run_eval
from posttrain.evaluation.tasksets import resolve_tasks
from posttrain.storage.store import Store
from tests.test_eval_support import CoinPolicy
from tests.toydomains import CrashingVerifier, add_domain

TASKS = "math.add.d3,text.reverse.l5"
CFG = EvalConfig(k=(1, 4), seed=3)


def _outcomes(result):
    return {(r.hash, s.index, s.attempt): (s.status, s.passed, s.score) for r in result.records for s in r.samples}


def _figures(summary):
    """Everything but timings (which no two runs share)."""
    drop = ("wall_s", "latency_s", "cost", "gen_s", "sandbox_s", "total_s")
    if isinstance(summary, dict):
        return {k: _figures(v) for k, v in summary.items() if k not in drop}
    return summary


def _kill_after(run_dir, run_id, keep):
    """What a kill leaves: the first `keep` samples stored (in the order they finished), no more."""
    db = sqlite3.connect(run_dir / "store.sqlite")
    gone = [i for (i,) in db.execute("SELECT id FROM trajectories WHERE run_id=? ORDER BY created_at, id "
                                     "LIMIT -1 OFFSET ?", (run_id, keep))]
    db.executemany("DELETE FROM turns WHERE trajectory_id=?", [(i,) for i in gone])
    db.executemany("DELETE FROM verdicts WHERE trajectory_id=?", [(i,) for i in gone])
    db.executemany("DELETE FROM trajectories WHERE id=?", [(i,) for i in gone])
    db.commit()
    db.close()
    return len(gone)


def test_a_resumed_evaluation_generates_only_the_missing_samples(tmp_path):
    tasks = resolve_tasks(TASKS, per_domain=6)
    with Store.for_run_dir(tmp_path / "full") as store:
        full = run_eval(CoinPolicy(0.5), tasks, CFG, name="x", store=store)
    shutil.copytree(tmp_path / "full", tmp_path / "cut")
    missing = _kill_after(tmp_path / "cut", "eval:x", keep=20)
    assert missing == 2 * 6 * 4 - 20
    policy = CoinPolicy(0.5)
    with Store.for_run_dir(tmp_path / "cut") as store:
        resumed = run_eval(policy, tasks, CFG, name="x", store=store, resume=True)
        assert len(policy.seeds) == missing  # one single-turn generation per missing sample
        assert sum(store.duplicates().values()) == 0 and store.counts("eval:x")["episodes"] == 48
    assert _outcomes(resumed) == _outcomes(full)
    assert _figures(resumed.summary) == _figures(full.summary)
    assert 0 < full.summary["micro_pass1"] < 1  # the coin really varies: the comparison can fail
    again = CoinPolicy(0.5)  # resuming a finished evaluation generates nothing at all
    with Store.for_run_dir(tmp_path / "cut") as store:
        assert _outcomes(run_eval(again, tasks, CFG, name="x", store=store, resume=True)) == _outcomes(full)
    assert again.seeds == []


def test_stored_samples_of_another_policy_or_other_settings_are_not_resumed(tmp_path):
    tasks = resolve_tasks("math.add.d2", per_domain=3)
    with Store.for_run_dir(tmp_path) as store:
        run_eval(CoinPolicy(0.5), tasks, CFG, name="x", store=store)
        with pytest.raises(ValueError, match=r"eval:x: its stored samples are of policy coin, not other"):
            run_eval(CoinPolicy(0.5, name="other"), tasks, CFG, name="x", store=store, resume=True)
        with pytest.raises(ValueError, match=r"other settings \(seed 3 -> 4\)"):
            run_eval(CoinPolicy(0.5), tasks, EvalConfig(k=(1, 4), seed=4), name="x", store=store, resume=True)


def test_a_sample_with_only_retryable_infra_errors_stored_runs_again(tmp_path, toy_registry):
    crash, ok = add_domain("toy.crash", CrashingVerifier()), add_domain("toy.ok")
    toy_registry(crash, ok)
    tasks = [(crash, crash.task(0, "eval")), (ok, ok.task(0, "eval"))]
    cfg = EvalConfig(k=(1,), retries=1)
    with Store.for_run_dir(tmp_path) as store:
        full = run_eval(CoinPolicy(1.0), tasks, cfg, name="x", store=store)
    # killed after the crashing sample's first attempt and the other sample: the crashing one
    # has a retry left, so it runs again; the finished one does not
    db = sqlite3.connect(tmp_path / "store.sqlite")
    db.execute("DELETE FROM trajectories WHERE domain='toy.crash' AND attempt=1")
    db.commit()
    db.close()
    policy = CoinPolicy(1.0)
    with Store.for_run_dir(tmp_path) as store:
        resumed = run_eval(policy, tasks, cfg, name="x", store=store, resume=True)
        assert sum(store.duplicates().values()) == 0
    assert len(policy.seeds) == 2  # the crashing sample's two attempts, nothing of toy.ok
    assert _figures(resumed.summary) == _figures(full.summary)


@pytest.mark.parametrize("cut_to", [0, 7])
def test_the_run_resumes_its_cut_evaluation(tmp_path, cut_to):
    from posttrain.pipeline.config import load_config
    from posttrain.pipeline.main import Job
    from tests.test_pipeline import SMOKE

    path = tmp_path / "job.toml"
    path.write_text(SMOKE.format(name="job", runs=tmp_path / "runs", steps=2))
    job = Job(load_config(path), Console(file=open(os.devnull, "w")))
    run_dir = job.run_dir
    tasks = job.eval_tasks()
    with Store.for_run_dir(run_dir) as store:
        full = job.evaluate(CoinPolicy(0.5), "before", tasks, store, None)
    (run_dir / "evals" / "before.json").unlink()  # killed before the result was written
    missing = _kill_after(run_dir, "eval:before", keep=cut_to)
    policy = CoinPolicy(0.5)
    with Store.for_run_dir(run_dir) as store:
        resumed = job.evaluate(policy, "before", tasks, store, None)
        assert sum(store.duplicates().values()) == 0
        assert store.counts("eval:before")["episodes"] == len(tasks) * 2
    assert len(policy.seeds) == missing
    assert _outcomes(resumed) == _outcomes(full) and _figures(resumed.summary) == _figures(full.summary)
    # cut short while evaluating other weights: superseded, evaluated again from scratch
    (run_dir / "evals" / "before.json").unlink()
    other = CoinPolicy(0.5, name="job/step-2")
    with Store.for_run_dir(run_dir) as store:
        job.evaluate(other, "before", tasks, store, None)
        assert store.run_policy_versions("eval:before") == {"job/step-2"}
    assert len(other.seeds) == len(tasks) * 2


def test_an_evaluation_of_the_same_name_over_other_tasks_is_not_loaded_or_resumed(tmp_path):
    """A benchmark that chose other domains for an evaluation of the same weights and name (a run
    trained further, its lowest domains chosen again) gets those domains' figures, not the file
    or rows of the earlier choice -- finished or cut short."""
    from posttrain.pipeline.config import load_config
    from posttrain.pipeline.main import Job
    from tests.test_pipeline import SMOKE

    path = tmp_path / "job.toml"
    path.write_text(SMOKE.format(name="job", runs=tmp_path / "runs", steps=2))
    job = Job(load_config(path), Console(file=open(os.devnull, "w")))
    first, second = resolve_tasks("math.add.d2", per_domain=3), resolve_tasks("text.reverse.l5", per_domain=3)
    with Store.for_run_dir(job.run_dir) as store:
        job.evaluate(CoinPolicy(0.5), "confirm", first, store, None)
        policy = CoinPolicy(0.5)
        again = job.evaluate(policy, "confirm", second, store, None)  # finished over `first`
        assert {r.domain for r in again.records} == {"text.reverse.l5"}
        assert len(policy.seeds) == len(second) * 2
        assert store.run_task_hashes("eval:confirm") == {t.hash for _, t in second}
        # cut short over `second`, asked for `first`: its rows are not this evaluation's
        (job.run_dir / "evals" / "confirm.json").unlink()
        policy = CoinPolicy(0.5)
        third = job.evaluate(policy, "confirm", first, store, None)
        assert {r.domain for r in third.records} == {"math.add.d2"} and len(policy.seeds) == len(first) * 2
        assert store.run_task_hashes("eval:confirm") == {t.hash for _, t in first}
        # the same tasks again: loaded, nothing drawn
        policy = CoinPolicy(0.5)
        job.evaluate(policy, "confirm", first, store, None)
        assert policy.seeds == []
        # `run_eval` itself refuses to resume rows of other tasks (`posttrain eval --resume`)
        with pytest.raises(ValueError, match=r"3 of its stored tasks are not among this evaluation's"):
            run_eval(CoinPolicy(0.5), second, job.config.eval, name="confirm", store=store, resume=True)
        # a task set that grew (a generator changed some tasks, another domain chosen too): the
        # samples of the tasks it still has are kept, only the new tasks' are drawn
        policy = CoinPolicy(0.5)
        both = job.evaluate(policy, "confirm", first + second, store, None)
        assert len(policy.seeds) == len(second) * 2
        assert {r.domain for r in both.records} == {"math.add.d2", "text.reverse.l5"}
        assert _outcomes(both).items() >= _outcomes(third).items()
        # and one that shrank: the dropped tasks' samples leave the store, nothing is drawn
        policy = CoinPolicy(0.5)
        only = job.evaluate(policy, "confirm", second, store, None)
        assert policy.seeds == [] and store.run_task_hashes("eval:confirm") == {t.hash for _, t in second}
        assert _outcomes(only) == {k: v for k, v in _outcomes(both).items() if k[0] in {t.hash for _, t in second}}
        assert sum(store.duplicates().values()) == 0


def test_posttrain_eval_resume_continues_only_a_named_evaluation(tmp_path):
    import json

    from typer.testing import CliRunner

    from posttrain.cli import app

    runner = CliRunner()
    args = ["eval", "--policy", "oracle", "--tasks", "math.add.d2", "--per-domain", "3", "--k", "1,2",
            "--run-dir", str(tmp_path), "--name", "x", "--json"]
    first = runner.invoke(app, args)
    assert first.exit_code == 0, first.output
    (tmp_path / "evals" / "x.json").unlink()
    _kill_after(tmp_path, "eval:x", keep=2)
    refused = runner.invoke(app, args)  # a taken name is never merged into
    assert refused.exit_code == 2 and "--resume to continue" in refused.output
    resumed = runner.invoke(app, [*args, "--resume"])
    assert resumed.exit_code == 0, resumed.output
    brief = lambda out: {k: v for k, v in json.loads(out.strip().splitlines()[-1]).items()  # noqa: E731
                         if k not in ("wall_s",)}
    assert _figures(brief(resumed.output)) == _figures(brief(first.output))
    with Store.for_run_dir(tmp_path, readonly=True) as store:
        assert store.counts("eval:x")["episodes"] == 6 and sum(store.duplicates().values()) == 0
    nothing = runner.invoke(app, [*args[:-5], "--run-dir", str(tmp_path), "--name", "y", "--resume"])
    assert nothing.exit_code == 2 and "no evaluation named 'y'" in nothing.output
