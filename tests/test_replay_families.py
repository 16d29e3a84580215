"""Replay reproduces an oracle episode of every sandboxed family, on the clock it recorded: a git
task's commit hashes (which depend on the clock) included; an episode cut by a time limit is said
to be timing-dependent, per trajectory, instead of failing the check."""

from __future__ import annotations

import json
import re
import sqlite3

import pytest
from typer.testing import CliRunner

from posttrain.cli import app
from posttrain.envs import sandbox_preload
from posttrain.sandbox import SandboxPool
from posttrain.sandbox.base import DEFAULT_CLOCK
from posttrain.scheduling.replay import replay
from posttrain.storage.store import Store

# sandboxed domains of every family: terminal (a git task, whose oracle prints its commit hash,
# and a file edit), code with tools, docs with tools, geometry
DOMAINS = ("terminal.git.init-commit", "terminal.config.comment-out", "code.repair.list.kth",
           "docs.lookup.cash-reconciliation.md", "geometry.script.box.dims")
GIT = DOMAINS[0]
OTHER_CLOCK = DEFAULT_CLOCK + 86_400 * 400

runner = CliRunner()


def _last_json(result):
    return json.loads(result.output.strip().splitlines()[-1])


def _record(run_dir, clock: int | None = DEFAULT_CLOCK, domains=DOMAINS) -> None:
    from posttrain.policies.scripted import ScriptedPolicy
    from posttrain.scheduling.engine import WorkItem, run_workload
    from posttrain.tasks.registry import get_domain

    oracle = ScriptedPolicy.named("oracle")
    items = [WorkItem(get_domain(name), get_domain(name).task(0, "train")) for name in domains]
    preload = sandbox_preload([get_domain(name) for name in domains])  # geometry's ptgeo.py
    with Store.for_run_dir(run_dir) as store, SandboxPool(size=1, clock=clock, preload=preload) as pool:
        run_workload(items, oracle, run_id="rec", player=oracle, sandbox_factory=pool.sandbox,
                     on_result=lambda r: store.put_trajectory(r.trajectory, r.task, r.workspace_archive))


def _git_hashes(run_dir) -> list[str]:
    with Store.for_run_dir(run_dir, readonly=True) as store:
        (traj,) = store.trajectories(domain=GIT)
    return re.findall(r"\b[0-9a-f]{7,}\b", "".join(t.observation for t in traj.turns[1:]))


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("replay")
    _record(run_dir)
    return run_dir


@pytest.mark.slow
def test_every_sandboxed_family_replays_identically(recorded):
    with Store.for_run_dir(recorded, readonly=True) as store:
        trajs = list(store.trajectories())
    assert sorted(t.domain for t in trajs) == sorted(DOMAINS)
    assert all(t.passed and t.sandbox.get("clock") == DEFAULT_CLOCK for t in trajs)
    assert _git_hashes(recorded), "the git oracle shows its commit hash (what a clock would change)"
    out = _last_json(runner.invoke(app, ["replay", str(recorded), "--all", "--json"]))
    assert out["replayed"] == len(DOMAINS) and out["matched"] == len(DOMAINS), out
    assert out["diverged"] == [] and out["timing_dependent"] == []


@pytest.mark.slow
def test_replay_runs_the_clock_the_episode_recorded(recorded, tmp_path):
    _record(tmp_path, clock=OTHER_CLOCK, domains=(GIT,))
    # the clock is what makes the hash: the same commit made on another day is another commit
    assert _git_hashes(tmp_path) and _git_hashes(tmp_path) != _git_hashes(recorded)
    result = runner.invoke(app, ["replay", str(tmp_path), "--all", "--json"])
    assert result.exit_code == 0 and _last_json(result)["matched"] == 1, result.output
    # a sandbox on another clock than the recorded one is reported, never compared
    with Store.for_run_dir(tmp_path, readonly=True) as store, SandboxPool(size=1) as pool:
        (traj,) = store.trajectories()
        res = replay(store, traj, sandbox_factory=pool.sandbox)
    assert not res.matched and res.divergence == {"turn": None, "field": "clock", "stored": OTHER_CLOCK,
                                                  "replayed": DEFAULT_CLOCK}


@pytest.mark.slow
def test_an_episode_cut_by_a_time_limit_is_said_to_be_timing_dependent(recorded, tmp_path):
    import shutil

    copy = tmp_path / "cut"
    shutil.copytree(recorded, copy)
    db = sqlite3.connect(copy / "store.sqlite")
    (tid, body), = db.execute("SELECT id, body FROM trajectories WHERE domain=?", (GIT,)).fetchall()
    record = json.loads(body)  # as recorded under load: its command hit the wall-clock limit
    record["counters"] = {**record.get("counters", {}), "limit_timeout": 1}
    db.execute("UPDATE trajectories SET body=? WHERE id=?", (json.dumps(record), tid))
    (turn,) = db.execute("SELECT body FROM turns WHERE trajectory_id=? AND idx=1", (tid,)).fetchone()
    t = json.loads(turn)
    t["observation"] = "[bash] exit=-9 (limit: timeout)\n"
    db.execute("UPDATE turns SET body=? WHERE trajectory_id=? AND idx=1", (json.dumps(t), tid))
    db.commit()
    db.close()
    result = runner.invoke(app, ["replay", str(copy), "--all", "--json"])
    out = _last_json(result)
    assert result.exit_code == 0, result.output  # not a failed check: it could not be pinned
    assert out["diverged"] == [] and [d["trajectory_id"] for d in out["timing_dependent"]] == [tid]
    assert "cut by a time limit (1 command(s): timeout)" in out["timing_dependent"][0]["timing"]
    text = runner.invoke(app, ["replay", str(copy), "--all"]).output
    assert "1 not reproducible (timing)" in text
    assert f"{tid}: diverges at turn 1 (observation); not reproducible" in text
