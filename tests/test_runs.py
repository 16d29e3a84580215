"""`posttrain runs`: status from the directory (lock held, summary, status file), steps, figures
and the command that resumes a stopped run."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from posttrain.runs import list_runs, mark

ROOT = Path(__file__).resolve().parents[1]


def _run_dir(parent: Path, name: str, steps_done: int, command: str = "") -> Path:
    d = parent / name
    (d / "checkpoints").mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"name": name, "steps": 10}))
    (d / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "reward_mean": s / 10}) + "\n"
                                             for s in range(1, steps_done + 1)))
    (d / "checkpoints" / "latest.json").write_text(json.dumps({"step": steps_done, "path": "x"}))
    (d / ".lock").write_text(json.dumps({"pid": 1, "command": command or f"posttrain run c.toml --name {name}",
                                         "what": "posttrain run"}))
    return d


def test_status_steps_figures_and_resume(tmp_path):
    done = _run_dir(tmp_path, "done", 10)
    (done / "summary.json").write_text(json.dumps({"base_pass1": 0.5, "final_pass1": 0.75}))
    failed = _run_dir(tmp_path, "broken", 4)
    mark(failed, "failed", "error: CUDA out of memory")
    _run_dir(tmp_path, "killed", 6, command="posttrain run my.toml --name killed --steps 10")
    live = _run_dir(tmp_path, "live", 2)
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom posttrain import runlock\n"
                               f"runlock.acquire({str(live)!r}, 'posttrain run')\nprint('ok', flush=True)\n"
                               "time.sleep(120)"], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    try:
        assert holder.stdout.readline().strip() == "ok"
        runs = {r.name: r for r in list_runs(tmp_path)}
    finally:
        holder.kill()
        holder.wait()
    assert {n: r.status for n, r in runs.items()} == {"done": "finished", "broken": "failed", "killed": "killed",
                                                      "live": "running"}
    assert runs["done"].figures == {"base_pass1": 0.5, "final_pass1": 0.75} and not runs["done"].resume
    assert runs["broken"].error == "error: CUDA out of memory" and runs["broken"].step == 4
    assert runs["killed"].step == 6 and runs["killed"].steps == 10 and runs["killed"].checkpoint_step == 6
    assert runs["killed"].figures == {"reward_mean": 0.6}
    assert runs["killed"].resume == "posttrain run my.toml --name killed --steps 10 --resume"
    assert not runs["live"].resume
    # once its owner is gone, the same directory reads as killed
    assert {r.name: r.status for r in list_runs(tmp_path)}["live"] == "killed"


@pytest.mark.slow
def test_cli_lists_runs(tmp_path):
    _run_dir(tmp_path, "killed", 3)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "COLUMNS": "200"}
    p = subprocess.run([sys.executable, "-m", "posttrain.cli", "runs", str(tmp_path), "--json"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    [run] = json.loads(p.stdout)["runs"]
    assert run["status"] == "killed" and run["resume"].endswith("--resume")
    p = subprocess.run([sys.executable, "-m", "posttrain.cli", "runs", str(tmp_path)],
                       capture_output=True, text=True, env=env, timeout=120)
    assert "killed" in p.stdout and "resume killed: posttrain run c.toml --name killed --resume" in p.stdout
    assert time.time() - json.loads(subprocess.run(
        [sys.executable, "-m", "posttrain.cli", "runs", str(tmp_path), "--json"], capture_output=True,
        text=True, env=env).stdout)["runs"][0]["updated"] < 600
