"""Harbor / Terminal-Bench task folders: the shipped examples, malformed folders, path rewriting,
and the reward channel (fresh directory, no reward = infrastructure error, no forging)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from posttrain.envs import play_actions
from posttrain.tasks.domain import NoTasksInSplit
from posttrain.tasks.families.terminal import EXAMPLES_DIR, harbor_examples
from posttrain.tasks.families.terminal.harbor import REWRITE, HarborTaskError, load_harbor_task
from posttrain.tasks.registry import all_domains
from posttrain.verifiers.base import VerifierError

EXAMPLES = {d.name: d for d in harbor_examples()}




def _task(d):
    try:
        return d.task(0, "train")
    except ValueError:
        return d.task(0, "eval")


def test_examples_are_registered_domains():
    assert 3 <= len(EXAMPLES) <= 5
    assert set(EXAMPLES) <= set(all_domains())
    assert "terminal.harbor.fix-config" in EXAMPLES


@pytest.mark.slow
def test_every_example_oracle_passes(sandbox, module_sandbox):
    for d in EXAMPLES.values():
        task = _task(d)
        assert task.env == "tools" and task.files and "/app" not in task.prompt.split("\n\n", 1)[1]
        module_sandbox[0].restore(module_sandbox[1])
        v = play_actions(d, task, d.oracle(task), sandbox=sandbox)
        assert v.passed and v.score == 1.0, (d.name, dict(v.details))


@pytest.mark.slow
def test_example_negatives_fail(sandbox, module_sandbox):
    for name in ("terminal.harbor.fix-config", "terminal.harbor.median-bugfix"):
        d = EXAMPLES[name]
        task = _task(d)
        negatives = d.negatives(task)
        assert {"empty", "wrong"} <= set(negatives)
        for key, neg in negatives.items():
            if name.endswith("median-bugfix") and key != "wrong":
                continue  # pytest-based: one negative is enough here
            module_sandbox[0].restore(module_sandbox[1])
            assert not play_actions(d, task, neg, sandbox=sandbox).passed, name


def test_a_single_task_serves_only_its_split():
    d = EXAMPLES["terminal.harbor.fix-config"]
    task = _task(d)
    other = "eval" if task.split == "train" else "train"
    with pytest.raises(NoTasksInSplit, match=f"no {other} tasks"):
        d.task(0, other)
    assert d.task(7, task.split) == task


def _copy(tmp_path: Path, name: str = "fix-config", source: str = "fix-config") -> Path:
    dst = tmp_path / name
    shutil.copytree(EXAMPLES_DIR / source, dst)
    return dst


@pytest.mark.parametrize("edit, match", [
    (lambda p: (p / "task.toml").unlink(), "task.toml: missing"),
    (lambda p: (p / "task.toml").write_text("[verifier\ntimeout_sec = 1"), "task.toml: invalid TOML"),
    (lambda p: (p / "task.toml").write_text("[verifier]\ntimeout_sec = 'soon'\n"), r"\[verifier\].timeout_sec"),
    (lambda p: (p / "task.toml").write_text("[agent]\ntimeout_sec = -5\n"), r"\[agent\].timeout_sec"),
    (lambda p: (p / "task.toml").write_text("metadata = 3\n"), r"\[metadata\] must be a table"),
    (lambda p: (p / "task.toml").write_text("[metadata]\nsplit = 'dev'\n"), r"\[metadata\].split"),
    (lambda p: (p / "instruction.md").unlink(), "instruction.md: missing"),
    (lambda p: (p / "instruction.md").write_text("  \n"), "instruction.md: empty"),
    (lambda p: (p / "tests" / "test.sh").unlink(), "tests/test.sh: missing"),
    (lambda p: (p / "solution" / "solve.sh").unlink(), "solution/solve.sh: missing"),
    (lambda p: (p / "tests" / "data.bin").write_bytes(b"\xff\xfe\x00"), "tests/data.bin: not UTF-8"),
    (lambda p: (p / "environment" / "Dockerfile").write_text("COPY service.ini /etc/x\n"), "Dockerfile:1: COPY destination"),
    (lambda p: (p / "environment" / "Dockerfile").write_text("WORKDIR /srv\n"), "Dockerfile:1: WORKDIR"),
    (lambda p: (p / "environment" / "Dockerfile").write_text("FROM x\nCOPY nope.txt /app/\n"), "Dockerfile:2: COPY source 'nope.txt'"),
    (lambda p: (p / "environment" / "Dockerfile").write_text("ADD https://x.org/a /app/a\n"), "must be a local path"),
])
def test_malformed_folders_name_the_file_and_field(tmp_path, edit, match):
    folder = _copy(tmp_path)
    edit(folder)
    with pytest.raises(HarborTaskError, match=match):
        load_harbor_task(folder)


def test_dockerfile_copy_forms_build_the_workspace(tmp_path):
    folder = _copy(tmp_path)
    (folder / "environment" / "conf").mkdir()
    (folder / "environment" / "conf" / "a.ini").write_text("a\n")
    (folder / "environment" / "Dockerfile").write_text(
        "FROM debian:12\nRUN apt-get update && \\\n    apt-get install -y python3\nWORKDIR /app\n"
        "COPY service.ini ./\nCOPY --chown=1000 conf /app/etc/\nCOPY service.ini /app/copy.ini\n")
    d = load_harbor_task(folder, name="My Task")
    task = _task(d)
    assert sorted(task.files) == ["copy.ini", "etc/a.ini", "service.ini"]
    assert task.domain == "terminal.harbor.my-task"


def test_path_rewriting():
    ns: dict = {}
    exec(REWRITE, ns)
    rw = ns["rewrite"]
    text = "cat /app/x.txt > /logs/verifier/reward.txt; ls /tests/ /app /apple ./app/x ~/app"
    assert rw(text, "/ws", "/t/tests", "/t/logs") == \
        "cat /ws/x.txt > /t/logs/reward.txt; ls /t/tests/ /ws /apple ./app/x ~/app"


def _custom(tmp_path: Path, test_sh: str, timeout: float = 60.0) -> object:
    folder = _copy(tmp_path, "custom")
    (folder / "task.toml").write_text(f"[verifier]\ntimeout_sec = {timeout}\n[metadata]\nsplit = 'train'\n")
    (folder / "tests" / "test.sh").write_text(test_sh)
    return load_harbor_task(folder)


def test_no_reward_or_a_hanging_test_is_an_infrastructure_error(tmp_path, sandbox, module_sandbox):
    d = _custom(tmp_path, "#!/bin/bash\necho ran\n")
    with pytest.raises(VerifierError, match="wrote no reward"):
        play_actions(d, d.task(0, "train"), ["<submit></submit>"], sandbox=sandbox)
    module_sandbox[0].restore(module_sandbox[1])
    d = _custom(tmp_path / "b", "#!/bin/bash\nsleep 30\necho 1 > /logs/verifier/reward.txt\n", timeout=0.5)
    with pytest.raises(VerifierError, match="timeout"):
        play_actions(d, d.task(0, "train"), ["<submit></submit>"], sandbox=sandbox)


def test_the_agent_cannot_pre_write_the_reward(tmp_path, sandbox):
    # The test passes only if a reward file already exists: the agent plants every candidate.
    test_sh = ("#!/bin/bash\nif [ -f /logs/verifier/reward.txt ]; then exit 0; fi\n"
               "echo 0 > /logs/verifier/reward.txt\n")
    d = _custom(tmp_path, test_sh)
    forge = ("<bash>mkdir -p logs/verifier tests /tmp/logs/verifier && echo 1 > logs/verifier/reward.txt && "
             "echo 1 > /tmp/logs/verifier/reward.txt && echo 1 > reward.txt && "
             "(while true; do for d in /tmp/ptharbor-*; do mkdir -p $d/logs/verifier; "
             "echo 1 > $d/logs/verifier/reward.txt; done; sleep 0.05; done) > /dev/null 2>&1 &</bash>")
    v = play_actions(d, d.task(0, "train"), [forge, "<submit>1</submit>"], sandbox=sandbox)
    assert not v.passed and v.details["reward"] == 0.0
