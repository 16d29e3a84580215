"""Another run's evaluation of the same weights is copied instead of drawn again
(`posttrain.evaluation.reuse`, `[eval] base_from`): only what it lacks is generated, the figures
equal a fresh evaluation's, and an evaluation of other weights, settings or source is refused."""

import dataclasses
import json
import sqlite3

import pytest

from posttrain.evaluation import EvalConfig, run_eval
from posttrain.evaluation.identity import source_fingerprint
from posttrain.evaluation.reuse import copy_evaluation
from posttrain.evaluation.tasksets import resolve_tasks
from posttrain.storage.store import Store
from posttrain.values.generation import PolicyVersion
from tests.test_eval_resume import _figures, _outcomes
from tests.test_eval_support import CoinPolicy

TASKS = "math.add.d3,text.reverse.l5"
CFG = EvalConfig(k=(1, 4), seed=3)


def _coin(weights="w1"):
    policy = CoinPolicy(0.5)
    policy.version = PolicyVersion(name="coin", weights_hash=weights, tokenizer_hash="t1")
    return policy


def _donor(tmp_path, per_domain=4):
    with Store.for_run_dir(tmp_path / "donor") as store:
        run_eval(_coin(), resolve_tasks(TASKS, per_domain=per_domain), CFG, name="before", store=store)
    return tmp_path / "donor"


def test_a_larger_evaluation_draws_only_what_the_other_run_lacks(tmp_path):
    donor = _donor(tmp_path, per_domain=4)
    tasks = resolve_tasks(TASKS, per_domain=6)  # 2 x 2 tasks more than the donor evaluated
    policy = _coin()
    with Store.for_run_dir(donor, readonly=True) as old, Store.for_run_dir(tmp_path / "b") as store:
        done = copy_evaluation(old, store, "eval:before", policy.version, CFG, {t.hash for _, t in tasks})
        assert (done.reason, done.copied) == (None, 2 * 4 * 4)
        again = copy_evaluation(old, store, "eval:before", policy.version, CFG, {t.hash for _, t in tasks})
        assert again.copied == done.copied  # a repeated copy (a resume) stores nothing twice
        assert store.counts("eval:before")["episodes"] == 32 and sum(store.duplicates().values()) == 0
        reused = run_eval(policy, tasks, CFG, name="before", store=store, resume=True)
    assert len(policy.seeds) == 2 * 2 * 4  # only the new tasks' samples were generated
    with Store.for_run_dir(tmp_path / "fresh") as store:
        fresh = run_eval(_coin(), tasks, CFG, name="before", store=store)
    assert _outcomes(reused) == _outcomes(fresh)
    assert _figures(reused.summary) == _figures(fresh.summary)
    assert 0 < fresh.summary["micro_pass1"] < 1  # the coin varies: a wrong copy would show


def test_tasks_outside_this_evaluation_are_not_copied(tmp_path):
    donor = _donor(tmp_path, per_domain=4)
    mine = resolve_tasks("math.add.d3", per_domain=2)
    with Store.for_run_dir(donor, readonly=True) as old, Store.for_run_dir(tmp_path / "b") as store:
        done = copy_evaluation(old, store, "eval:before", _coin().version, CFG, {t.hash for _, t in mine})
        assert done.copied == 2 * 4
        assert {t.task_hash for t in store.trajectories(run_id="eval:before")} == {t.hash for _, t in mine}


@pytest.mark.parametrize("change, reason", [
    ({"weights": "w2"}, "weights differ"),
    ({"config": dataclasses.replace(CFG, seed=4)}, "other settings (seed 3 -> 4)"),
    ({"config": dataclasses.replace(CFG, k=(1, 8))}, "other settings (k (1, 4) -> (1, 8))"),
    ({"run_id": "eval:after"}, "holds no such evaluation"),
])
def test_an_evaluation_of_other_weights_or_settings_is_not_reused(tmp_path, change, reason):
    donor = _donor(tmp_path)
    tasks = resolve_tasks(TASKS, per_domain=4)
    version = _coin(change.get("weights", "w1")).version
    with Store.for_run_dir(donor, readonly=True) as old, Store.for_run_dir(tmp_path / "b") as store:
        done = copy_evaluation(old, store, change.get("run_id", "eval:before"), version,
                               change.get("config", CFG), {t.hash for _, t in tasks})
        assert done.copied == 0 and reason in done.reason
        assert store.counts()["episodes"] == 0


@pytest.mark.parametrize("edit, reason", [
    (lambda c: c.update(source="0" * 64), "other posttrain source"),
    (lambda c: c.pop("weights_hash"), "without the identity"),  # recorded before reuse existed
])
def test_an_evaluation_of_other_source_or_unknown_identity_is_not_reused(tmp_path, edit, reason):
    donor = _donor(tmp_path)
    db = sqlite3.connect(donor / "store.sqlite")
    config = json.loads(db.execute("SELECT config FROM runs WHERE id='eval:before'").fetchone()[0])
    assert config["source"] == source_fingerprint() and config["weights_hash"] == "w1"
    edit(config)
    db.execute("UPDATE runs SET config=? WHERE id='eval:before'", (json.dumps(config),))
    db.commit()
    db.close()
    with Store.for_run_dir(donor, readonly=True) as old, Store.for_run_dir(tmp_path / "b") as store:
        done = copy_evaluation(old, store, "eval:before", _coin().version, CFG,
                               {t.hash for _, t in resolve_tasks(TASKS, per_domain=4)})
        assert done.copied == 0 and reason in done.reason


def test_the_source_fingerprint_covers_the_package(tmp_path, monkeypatch):
    import posttrain.evaluation.identity as reuse

    first = source_fingerprint()
    assert len(first) == 64 and source_fingerprint() == first  # computed once a process
    fake = tmp_path / "posttrain" / "evaluation"
    fake.mkdir(parents=True)
    (fake / "reuse.py").write_text("x = 1\n")
    monkeypatch.setattr(reuse, "__file__", str(fake / "reuse.py"))
    reuse.source_fingerprint.cache_clear()
    try:
        a = source_fingerprint()
        (fake / "verifier.py").write_text("y = 2\n")
        reuse.source_fingerprint.cache_clear()
        assert source_fingerprint() != a  # a file added anywhere in the package changes it
    finally:
        reuse.source_fingerprint.cache_clear()


def _run_config(tmp_path, name, **evals):
    from posttrain.pipeline.config import load_config

    text = (f'name = "{name}"\nruns_dir = "{tmp_path / "runs"}"\nsteps = 1\ncheckpoint_every = 1\n'
            '[domains]\ntrain = ["math.add.d2", "text.reverse.l3"]\nheldout = ["math.add.d1"]\n'
            '[rollout]\ngroup_size = 4\ngroups_per_step = 2\n[eval]\ntasks_per_domain = 3\nsamples = 2\n'
            + "".join(f'{k} = "{v}"\n' for k, v in evals.items()))
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    return load_config(path)


def test_base_from_must_name_another_run(tmp_path):
    from posttrain.pipeline.config import ConfigError
    from posttrain.pipeline.main import Job

    with pytest.raises(ConfigError, match=r"eval.base_from: .*nowhere: no run there"):
        Job(_run_config(tmp_path, "b", base_from=tmp_path / "nowhere"))
    (tmp_path / "runs" / "b").mkdir(parents=True)
    (tmp_path / "runs" / "b" / "store.sqlite").touch()
    with pytest.raises(ConfigError, match="this run's own directory"):
        Job(_run_config(tmp_path, "b", base_from=tmp_path / "runs" / "b"))


def test_a_run_reuses_the_base_evaluation_of_another_run(tmp_path):
    from rich.console import Console

    from posttrain.evaluation.result import EvalResult
    from posttrain.pipeline.main import Job

    Job(_run_config(tmp_path, "a"), Console(file=open(tmp_path / "a.log", "w"))).run()
    log = tmp_path / "b.log"
    with open(log, "w") as f:
        Job(_run_config(tmp_path, "b", base_from=tmp_path / "runs" / "a"), Console(file=f, width=200)).run()
    a, b = (EvalResult.load(tmp_path / "runs" / n / "evals" / "before.json") for n in "ab")
    assert b.reused == {"from": str(tmp_path / "runs" / "a"), "samples": 3 * 3 * 2} and not a.reused
    assert _outcomes(b) == _outcomes(a) and _figures(b.summary) == _figures(a.summary)
    text = log.read_text()
    assert "before: 18 of 18 samples reused from" in text
    assert "after: nothing reused from" in text
    assert "its policy differs (a/step-1 there, b/step-1 here)" in text
    assert not EvalResult.load(tmp_path / "runs" / "b" / "evals" / "after.json").reused
    report = (tmp_path / "runs" / "b" / "report.html").read_text()
    assert f"(18 samples copied from {tmp_path / 'runs' / 'a'})" in report
    stamps = []  # the very trajectories run a drew (a fresh draw would be stamped at its own time)
    for n in "ab":
        with Store.for_run_dir(tmp_path / "runs" / n, readonly=True) as store:
            stamps.append({t.id: t.created_at for t in store.trajectories(run_id="eval:before")})
    assert stamps[0] == stamps[1] and len(stamps[0]) == 18
