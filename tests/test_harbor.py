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
        assert task.env == "tools" and task.verifier["image"]["recipe"] and "In /app: " in task.prompt
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


MALFORMED = [
    (lambda p: (p / "task.toml").unlink(), "task.toml: missing"),
    (lambda p: (p / "task.toml").write_text("[verifier\ntimeout_sec = 1"), "task.toml: invalid TOML"),
    (lambda p: (p / "task.toml").write_text("[verifier]\ntimeout_sec = 'soon'\n"), r"\[verifier\].timeout_sec"),
    (lambda p: (p / "task.toml").write_text("[agent]\ntimeout_sec = -5\n"), r"\[agent\].timeout_sec"),
    # a grader with no time limit is one a policy can hang: inf is not a timeout
    (lambda p: (p / "task.toml").write_text("[verifier]\ntimeout_sec = inf\n"), r"\[verifier\].timeout_sec must be a positive, finite"),
    (lambda p: (p / "task.toml").write_text("[agent]\ntimeout_sec = nan\n"), r"\[agent\].timeout_sec must be a positive, finite"),
    (lambda p: (p / "task.toml").write_text("metadata = 3\n"), r"\[metadata\] must be a table"),
    (lambda p: (p / "task.toml").write_text("[metadata]\nsplit = 'dev'\n"), r"\[metadata\].split"),
    (lambda p: (p / "instruction.md").unlink(), "instruction.md: missing"),
    (lambda p: (p / "instruction.md").write_text("  \n"), "instruction.md: empty"),
    (lambda p: (p / "tests" / "test.sh").unlink(), "tests/test.sh: missing"),
    (lambda p: (p / "solution" / "solve.sh").unlink(), "solution/solve.sh: missing"),
    (lambda p: (p / "tests" / "data").symlink_to("/etc"), "tests/data: symlink 'data'"),
    (lambda p: (p / "environment" / "Dockerfile").write_text("COPY service.ini /etc/x\n"), "Dockerfile:1: COPY before FROM"),
]
DOCKERFILE_ERRORS = [
    ("FROM alpine:3\n", "Dockerfile:1: FROM alpine:3: not a base"),
    ("FROM python:3.9-slim\n", "Dockerfile:1: FROM python:3.9-slim: this machine provides Python 3.11"),
    ("FROM debian:12\nCOPY nope.txt /app/\n", "Dockerfile:2: COPY source 'nope.txt' not found"),
    ("FROM debian:12\nADD https://x.org/a /app/a\n", "Dockerfile:2: ADD of a URL"),
    ("FROM debian:12\nFROM debian:12\n", "Dockerfile:2: a second FROM"),
    ("FROM debian:12 AS a\nCOPY --from=a /x /y\n", "Dockerfile:2: COPY --from"),
    ("FROM debian:12\nRUN --mount=type=cache,target=/x true\n", "Dockerfile:2: the flag --mount"),
    ("FROM debian:12\nRUN --network=host true\n", "Dockerfile:2: RUN --network=host"),
    ("FROM debian:12\n\nRUN --network=default true\n", "Dockerfile:3: RUN --network=default needs the network"),
    ("FROM debian:12\nADD --checksum=md5:ab https://x.org/a /a\n", "Dockerfile:2: ADD --checksum=md5:ab: expected sha256"),
    ("FROM debian:12\nADD https://x.org/a service.ini /app/\n", "Dockerfile:2: ADD of a URL takes one"),
    ("FROM debian:12\nRUN --network=none true\n", None),
    ("FROM debian:12\nVOLUME /data\n", "Dockerfile:2: VOLUME is not supported"),
    ("FROM debian:12\nHEALTHCHECK CMD true\n", "Dockerfile:2: HEALTHCHECK is not supported"),
    ("FROM debian:12\nSTOPSIGNAL KILL\n", "Dockerfile:2: STOPSIGNAL"),
    ("FROM debian:12\n\nONBUILD RUN true\n", "Dockerfile:3: ONBUILD"),
    ("FROM debian:12\nFOO bar\n", "Dockerfile:2: unknown or unsupported instruction FOO"),
    ("FROM debian:12\nRUN <<EOF\necho hi\nEOF\n", "Dockerfile:2: RUN heredocs"),
    ("# escape=`\nFROM debian:12\n", "Dockerfile:1: the escape directive"),
    ("FROM debian:12\nCOPY --chmod=u+x service.ini /app/\n", "Dockerfile:2: COPY --chmod=u\\+x"),
    ("FROM debian:12\nRUN true\n", None),  # the control: a valid file loads
]


@pytest.mark.parametrize("edit, match", MALFORMED)
def test_malformed_folders_name_the_file_and_field(tmp_path, edit, match):
    folder = _copy(tmp_path)
    edit(folder)
    with pytest.raises(HarborTaskError, match=match):
        load_harbor_task(folder)


@pytest.mark.parametrize("text, match", DOCKERFILE_ERRORS, ids=[m or "ok" for _, m in DOCKERFILE_ERRORS])
def test_what_a_dockerfile_cannot_do_is_an_error_naming_the_line(tmp_path, text, match):
    folder = _copy(tmp_path)
    (folder / "environment" / "Dockerfile").write_text(text)
    if match is None:
        assert load_harbor_task(folder).task(0, _task(load_harbor_task(folder)).split)
        return
    with pytest.raises(HarborTaskError, match="fix-config/environment/" + match):
        load_harbor_task(folder)


def test_dockerfile_copy_forms_build_the_workspace(tmp_path):
    folder = _copy(tmp_path)
    (folder / "environment" / "conf").mkdir()
    (folder / "environment" / "conf" / "a.ini").write_text("a\n")
    (folder / "environment" / "Dockerfile").write_text(
        "FROM debian:12\nRUN apt-get update && \\\n    apt-get install -y python3\nWORKDIR /app\n"
        "COPY service.ini ./\nCOPY --chown=1000 conf /app/etc/\nCOPY service.ini /app/copy.ini\n")
    (folder / "environment" / "conf" / ".hidden").write_text("h\n")
    d = load_harbor_task(folder, name="My Task")
    task = _task(d)
    # the first observation: the names the Dockerfile puts in WORKDIR, no hidden ones
    assert task.prompt.endswith("In /app: copy.ini, etc/, service.ini")
    assert task.domain == "terminal.harbor.my-task"
    many = folder / "environment" / "many"
    many.mkdir()
    for i in range(30):
        (many / f"f{i:02d}.txt").write_text("x")
        (many / f".h{i:02d}").write_text("x")
    (folder / "environment" / "Dockerfile").write_text("FROM debian:12\nWORKDIR /app\nCOPY many/ ./\n")
    prompt = _task(load_harbor_task(folder)).prompt
    assert prompt.endswith("f19.txt (and 10 more)") and ".h" not in prompt


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


def test_no_reward_or_a_hanging_test_is_a_failure_not_an_infrastructure_error(tmp_path, sandbox, module_sandbox):
    # the agent's code runs inside the tests and can stop them before they write a reward
    d = _custom(tmp_path, "#!/bin/bash\necho ran\n")
    v = play_actions(d, d.task(0, "train"), ["<submit></submit>"], sandbox=sandbox)
    assert not v.passed and "wrote no reward" in v.details["reason"]
    module_sandbox[0].restore(module_sandbox[1])
    d = _custom(tmp_path / "b", "#!/bin/bash\nsleep 30\necho 1 > /logs/verifier/reward.txt\n", timeout=0.5)
    v = play_actions(d, d.task(0, "train"), ["<submit></submit>"], sandbox=sandbox)
    assert not v.passed and "timeout" in v.details["reason"]


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


def test_source_harbor_adds_a_folder_of_tasks_and_skips_a_broken_one(tmp_path):
    from typer.testing import CliRunner

    from posttrain.cli import app
    from posttrain.tasks import registry

    for name in ("alpha", "beta"):
        _copy(tmp_path / "suite" / "group", name)
    (tmp_path / "suite" / "broken").mkdir()
    (tmp_path / "suite" / "broken" / "task.toml").write_text("[metadata]\n")
    runner = CliRunner()
    try:
        r = runner.invoke(app, ["tasks", "list", "--source", f"harbor:{tmp_path / 'suite'}"])
        assert r.exit_code == 0, r.output
        assert "terminal.harbor.alpha" in r.output and "terminal.harbor.beta" in r.output
        assert "terminal.harbor.broken" in registry.broken()
        assert "broken/instruction.md: missing" in registry.broken()["terminal.harbor.broken"].error
        r = runner.invoke(app, ["tasks", "show", "terminal.harbor.broken", "--source",
                                f"harbor:{tmp_path / 'suite'}"])
        # the error box wraps the message at the terminal's width, wherever the temporary path's
        # length puts the break: compare without the box and the whitespace
        flat = "".join(c for c in r.output if not c.isspace() and c != "\u2502")
        assert r.exit_code != 0 and "instruction.md:missing" in flat
        r = runner.invoke(app, ["tasks", "list", "--source", f"harbor:{tmp_path / 'nowhere'}"])
        assert r.exit_code == 2 and "not a directory" in r.output
    finally:
        registry.reset_cache()
