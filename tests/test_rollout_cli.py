"""`posttrain rollout` / `replay` / `export` over real domains of every family."""

import json
import sqlite3

import pytest
from typer.testing import CliRunner

from posttrain.cli import app

# one domain per family, both environment kinds
DOMAINS = ("math.add.d2,text.reverse.l5,docs.finance.balance-totals.md,rg.basic_arithmetic,"
           "code.repair.list.kth,terminal.config.comment-out,geometry.script.box.dims")

runner = CliRunner()


def _json(result):
    assert result.exit_code in (0, 1), result.output
    return json.loads(result.output.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def oracle_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("rollout")
    result = runner.invoke(app, ["rollout", "--policy", "oracle", "--domains", DOMAINS, "--n", "2",
                                 "--run-dir", str(run_dir), "--json"])
    assert result.exit_code == 0, result.output
    return run_dir, json.loads(result.output.strip().splitlines()[-1])


@pytest.mark.slow
def test_oracle_episodes_of_every_family_pass(oracle_run):
    _, counts = oracle_run
    assert counts == {"episodes": 14, "completed": 14, "truncated": 0, "infra_error": 0, "passed": 14}


@pytest.mark.slow
def test_wrong_answers_of_every_family_fail(tmp_path):
    counts = _json(runner.invoke(app, ["rollout", "--policy", "wrong", "--domains", DOMAINS, "--n", "1",
                                       "--run-dir", str(tmp_path), "--json"]))
    assert counts["episodes"] == 7 and counts["passed"] == 0 and counts["infra_error"] == 0


@pytest.mark.slow
def test_replay_matches_oracle_episodes_and_rescore_agrees(oracle_run):
    run_dir, _ = oracle_run
    out = _json(runner.invoke(app, ["replay", str(run_dir), "--all", "--json"]))
    assert out["replayed"] == 14 and out["matched"] == 14, out["diverged"]
    out = _json(runner.invoke(app, ["replay", str(run_dir), "--all", "--rescore", "--json"]))
    assert out["replayed"] == 14 and out["matched"] == 14, out["diverged"]


@pytest.mark.slow
def test_replay_reports_the_first_divergence_of_a_tampered_trajectory(oracle_run, tmp_path):
    run_dir, _ = oracle_run
    import shutil
    copy = tmp_path / "tampered"
    shutil.copytree(run_dir, copy)
    db = sqlite3.connect(copy / "store.sqlite")
    traj_id, = db.execute("SELECT id FROM trajectories WHERE domain='terminal.config.comment-out' "
                          "ORDER BY id LIMIT 1").fetchone()
    body = json.loads(db.execute("SELECT body FROM turns WHERE trajectory_id=? AND idx=0",
                                 (traj_id,)).fetchone()[0])
    body["action"] = "<bash>echo tampered > /dev/null; ls /nonexistent</bash>"
    db.execute("UPDATE turns SET body=? WHERE trajectory_id=? AND idx=0", (json.dumps(body), traj_id))
    db.commit()
    db.close()
    result = runner.invoke(app, ["replay", str(copy), traj_id, "--json"])
    assert result.exit_code == 1
    out = json.loads(result.output.strip().splitlines()[-1])
    div = out["diverged"][0]["divergence"]
    # the tampered first action's tool call now fails: turn 0 is where the episodes part ways
    assert out["matched"] == 0 and div["turn"] == 0 and div["field"] == "tool_results_ok", div


@pytest.mark.slow
def test_export_parquet_roundtrip(oracle_run, tmp_path):
    run_dir, _ = oracle_run
    out = tmp_path / "t.parquet"
    result = runner.invoke(app, ["export", str(run_dir), "--format", "parquet", "--out", str(out)])
    assert result.exit_code == 0, result.output
    import pyarrow.parquet as pq
    table = pq.read_table(out)
    assert table.num_rows == 14 and set(table.column("status").to_pylist()) == {"completed"}
    bad = runner.invoke(app, ["export", str(tmp_path / "nothing"), "--format", "parquet", "--out", str(out)])
    assert bad.exit_code == 2 and "no store" in bad.output


def test_unknown_domain_and_policy_are_clear_errors(tmp_path):
    r = runner.invoke(app, ["rollout", "--domains", "nope.*", "--run-dir", str(tmp_path)])
    assert r.exit_code == 2 and "no domain matches" in r.output
    r = runner.invoke(app, ["replay", str(tmp_path)])
    assert r.exit_code == 2


def test_an_episode_that_outgrew_the_model_context_is_truncated_and_replays(tmp_path):
    from posttrain.scheduling.engine import run_episodes
    from posttrain.scheduling.replay import replay
    from posttrain.storage.store import Store
    from posttrain.tasks.registry import get_domain
    from posttrain.values.generation import Completion, PolicyVersion

    class Outgrows:
        version = PolicyVersion("small-context")

        def generate(self, requests):
            return [Completion(text="<bash>ls</bash>", finish_reason="stop") if r.meta["turn"] == 0 else
                    Completion(text="", finish_reason="error", context_exceeded=True,
                               error="prompt of 900 tokens does not fit the model's maximum context "
                                     "length of 128 tokens")
                    for r in requests]

    d = get_domain("terminal.config.comment-out")
    (t,) = run_episodes([(d, d.task(0))], Outgrows())
    assert t.status == "truncated" and t.counters["context_budget_exhausted"] == 1 and len(t.turns) == 1
    with Store.for_run_dir(tmp_path) as store:
        store.start_run("r", {})
        t.run_id = "r"
        store.put_trajectory(t, d.task(0))
        result = replay(store, store.get_trajectory(t.id))
    assert result.matched, result.divergence


def test_domains_without_tasks_in_the_split_are_skipped_with_a_note(tmp_path, monkeypatch):
    """An imported single task lives in one split: `--domains '*'` must not die on it."""
    import shutil
    from pathlib import Path

    import posttrain.tasks.families.terminal as terminal
    from posttrain.tasks import registry

    # pinned to the eval split: an unpinned folder's split follows its content
    folder = tmp_path / "harbor" / "count-errors"
    shutil.copytree(Path(__file__).resolve().parents[1] / "examples" / "harbor" / "count-errors", folder)
    toml = folder / "task.toml"
    toml.write_text(toml.read_text().replace("[metadata]\n", '[metadata]\nsplit = "eval"\n'))
    monkeypatch.setattr(terminal, "EXAMPLES_DIR", folder.parent)
    monkeypatch.setattr(registry, "_domains", None)
    monkeypatch.setattr(registry, "_sources", {})
    monkeypatch.setattr(registry, "_broken", {})
    eval_only = "terminal.harbor.count-errors"
    result = runner.invoke(
        app, ["rollout", "--domains", f"math.add.d1,{eval_only}", "--n", "1", "--run-dir",
              str(tmp_path / "run"), "--json"])
    assert result.exit_code == 0, result.output
    assert f"with no train-split tasks: {eval_only}" in result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1])["episodes"] == 1
    result = runner.invoke(
        app, ["rollout", "--domains", eval_only, "--run-dir", str(tmp_path / "none")])
    assert result.exit_code == 2 and "has train-split tasks" in result.stderr
