"""A newcomer's path: a 1,000-row JSONL of question/answer pairs, one config edit, `posttrain run`."""

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow  # a real `posttrain run`

CONFIG = """
name = "byo"
runs_dir = "runs"
steps = 3
checkpoint_every = 3
[domains]
sources = ["data:qa.jsonl"]          # the one edit: everything else is a small, fast run
[rollout]
group_size = 4
groups_per_step = 4
[eval]
tasks_per_domain = 4
samples = 2
"""


def test_train_on_a_question_answer_file_with_one_config_edit(tmp_path):
    rng = random.Random(7)
    with open(tmp_path / "qa.jsonl", "w") as f:
        for _ in range(1000):
            a, b = rng.randint(10, 99), rng.randint(10, 99)
            f.write(json.dumps({"question": f"{a}+{b}=", "answer": str(a + b)}) + "\n")
    (tmp_path / "byo.toml").write_text(CONFIG)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    p = subprocess.run([sys.executable, "-m", "posttrain.cli", "run", "byo.toml", "--json"], cwd=tmp_path,
                       env=env, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:] + p.stdout[-2000:]
    summary = json.loads(p.stdout.strip().splitlines()[-1])
    assert summary["steps"] == 3 and 0 <= summary["final_pass1"] <= 1
    run = tmp_path / "runs" / "byo"
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all("domain/data.qa/reward" in r for r in rows)  # the data domain is what was trained
    before = json.loads((run / "evals" / "before.json").read_text())
    assert "data.qa" in json.dumps(before)
    contamination = json.loads((run / "contamination.json").read_text())
    assert contamination["leaked_eval_tasks"] == 0
    # every scalar of metrics.jsonl, and the evaluations, reached TensorBoard (the default tracker)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    for tag in ("loss", "kl", "domain/data.qa/reward", "family/data/pass_rate", "sched/generator_busy",
                "eval/before/data.qa/pass@1", "eval/after/data.qa/pass@1"):
        assert tag in tags, (tag, sorted(tags))
    assert [e.step for e in acc.Scalars("loss")] == [1, 2, 3]
    assert [e.value for e in acc.Scalars("domain/data.qa/reward")] == pytest.approx(
        [r["domain/data.qa/reward"] for r in rows])
    p = subprocess.run([sys.executable, "-m", "posttrain.cli", "runs", "runs", "--json"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120)
    [listed] = json.loads(p.stdout)["runs"]
    assert listed["status"] == "finished" and listed["step"] == 3 and "final_pass1" in listed["figures"]
    from posttrain.storage.store import Store

    with Store.for_run_dir(run, readonly=True) as store:
        trained = [t for t in store.trajectories(run_id="byo") if t.split == "train"]
        assert trained and {t.domain for t in trained} == {"data.qa"}
        assert all(t.task_key.startswith("data.qa/train/row") for t in trained)
