"""Harbor conformance, replay: a run whose tasks ran over built images replays in a new process,
from another directory, after the image cache was pruned (the image is rebuilt from the task
folder the run recorded), and says which image and which source when it cannot be."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from posttrain.sandbox.bwrap import bwrap_problem

ROOT = Path(__file__).resolve().parents[1]
PROBLEM = bwrap_problem()
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(PROBLEM is not None, reason=f"bubblewrap unavailable: {PROBLEM}")]

TASK = {
    "instruction.md": "Write twice the number in /app/n.txt to /app/out.txt.\n",
    "task.toml": "[metadata]\nsplit = 'train'\n[verifier]\ntimeout_sec = 60\n",
    "environment/Dockerfile": "FROM python:3.11-slim\nWORKDIR /app\nRUN echo 21 > /app/n.txt\n",
    "solution/solve.sh": "echo $(( $(cat /app/n.txt) * 2 )) > /app/out.txt\n",
    "tests/test.sh": "if [ \"$(cat /app/out.txt)\" = 42 ]; then echo 1; else echo 0; fi "
                     "> /logs/verifier/reward.txt\n",
}


def _cli(args, cwd, cache):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "POSTTRAIN_IMAGE_CACHE": str(cache)}
    return subprocess.run([sys.executable, "-m", "posttrain.cli", *args], capture_output=True,
                          text=True, env=env, cwd=cwd, timeout=600)


@pytest.mark.timeout(900)
def test_replay_rebuilds_a_pruned_image_in_a_new_process(tmp_path):
    made, elsewhere, cache = tmp_path / "made", tmp_path / "elsewhere", tmp_path / "cache"
    elsewhere.mkdir()
    for rel, text in TASK.items():
        (made / "tasks" / "double" / rel).parent.mkdir(parents=True, exist_ok=True)
        (made / "tasks" / "double" / rel).write_text(text)
    p = _cli(["rollout", "--source", "harbor:tasks", "--domains", "terminal.harbor.double", "--n", "1",
              "--run-dir", "run", "--json"], made, cache)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["episodes"] == 1

    p = _cli(["image", "prune", "--all"], elsewhere, cache)
    assert p.returncode == 0 and "1 images" in p.stdout, (p.stdout, p.stderr)
    assert not list((cache / "images").iterdir()) and not list((cache / "layers").iterdir())

    p = _cli(["replay", str(made / "run"), "--all", "--json"], elsewhere, cache)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert (out["replayed"], out["matched"], out["diverged"]) == (1, 1, [])
    assert len(list((cache / "images").iterdir())) == 1  # built again from the recorded folder

    # the folder's Dockerfile changed since the run: the image the run used cannot be made
    dockerfile = made / "tasks" / "double" / "environment" / "Dockerfile"
    dockerfile.write_text(TASK["environment/Dockerfile"].replace("21", "22"))
    p = _cli(["replay", str(made / "run"), "--all"], elsewhere, cache)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert "double/environment/Dockerfile" in p.stderr and "changed since" in p.stderr, p.stderr
    assert f"harbor:{(made / 'tasks').resolve()}" in p.stderr, p.stderr
    p = _cli(["replay", str(made / "run"), "--all", "--rescore"], elsewhere, cache)
    assert p.returncode == 2 and "Traceback" not in p.stderr and "changed since" in p.stderr, p.stderr
