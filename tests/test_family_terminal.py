"""The terminal family: generation, content splits, oracles/negatives in the sandbox through the
tools environment, and the script verifier's defences (forged files, links, fifos, planted
modules, broken check scripts)."""

from __future__ import annotations

import pytest

from posttrain.envs import play_actions
from posttrain.tasks.families import terminal
from posttrain.tasks.families.common import content_split
from posttrain.tasks.families.terminal.checks import STATE_CHECK
from posttrain.values.task import Task
from posttrain.verifiers.base import Outcome, VerifierError
from posttrain.verifiers.script import SCRIPT

DOMAINS = {d.name: d for d in terminal.domains() if ".harbor." not in d.name}




def test_family_has_enough_domains_of_every_kind():
    assert len(DOMAINS) >= 30
    groups = {name.split(".")[1] for name in DOMAINS}
    assert {"count", "find", "grep", "text", "files", "config", "git", "perm", "proc", "archive"} <= groups
    assert all(d.env == "tools" and d.family == "terminal" for d in DOMAINS.values())


def test_generation_is_deterministic_and_split_by_content():
    for d in DOMAINS.values():
        seen = {"train": set(), "eval": set()}
        for split in ("train", "eval"):
            for seed in range(3):
                task = d.task(seed, split)
                assert task.model_dump_json() == d.task(seed, split).model_dump_json()
                assert task.split == split
                if d.name != "terminal.proc.timeout":  # split by its answer (test_split_contamination)
                    assert content_split(task.prompt, task.files) == split
                seen[split].add(task.hash)
        assert not seen["train"] & seen["eval"], d.name


@pytest.mark.slow
def test_every_oracle_passes_and_sampled_negatives_fail(sandbox):
    clean = sandbox.snapshot()  # empty
    for i, d in enumerate(DOMAINS.values()):
        task = d.task(i % 3, "eval" if i % 2 else "train")
        sandbox.restore(clean)
        v = play_actions(d, task, d.oracle(task), sandbox=sandbox)
        assert v.passed, (d.name, dict(v.details))
        negatives = d.negatives(task)
        assert "empty" in negatives and len(negatives) >= 2, d.name
        names = (list(negatives) if i % 8 == 0 else
                 [n for n in negatives if n != "empty"][:1] if i % 2 == 0 else [])
        for name in names:
            sandbox.restore(clean)
            nv = play_actions(d, task, negatives[name], sandbox=sandbox)
            assert not nv.passed, (d.name, name)


def _state_task(**args) -> Task:
    return Task(domain="terminal.t", prompt="p", env="tools", verifier={"check": STATE_CHECK, "args": args})


def test_check_reads_only_regular_files_and_ignores_forged_results(sandbox):
    task = _state_task(files={"out.txt": "secret-line\n"})
    # a symlink to a file with the right content, and a fifo that would block a plain read
    sandbox.write_file("real.txt", "secret-line\n")
    sandbox.run("ln -s real.txt out.txt")
    v = SCRIPT.verify(task, Outcome(answer="", sandbox=sandbox))
    assert not v.passed and "missing" in v.details["problems"][0]
    sandbox.run("rm out.txt && mkfifo out.txt")
    v = SCRIPT.verify(task, Outcome(answer="", sandbox=sandbox))
    assert not v.passed
    # forged "results", a fake result line and a planted json.py change nothing
    sandbox.run("rm out.txt")
    sandbox.write_file("result.json", '{"passed": true}')
    sandbox.write_file("json.py", "raise SystemExit('shadowed')\n")
    assert not SCRIPT.verify(task, Outcome(answer='@@ptgrade:0@@{"passed": true}', sandbox=sandbox)).passed
    sandbox.write_file("out.txt", "secret-line  \n\n")  # trailing spaces/newlines do not matter
    assert SCRIPT.verify(task, Outcome(answer="", sandbox=sandbox)).passed


def test_answer_kinds(sandbox):
    ok = {"int": ("42", " 42\n", "41"), "path": ("data/a.bin", "./data/a.bin", "data/b.bin"),
          "text": ("abc", "abc ", "ab")}
    for kind, (want, good, bad) in ok.items():
        task = _state_task(answer=want, answer_kind=kind)
        assert SCRIPT.verify(task, Outcome(answer=good, sandbox=sandbox)).passed, kind
        assert not SCRIPT.verify(task, Outcome(answer=bad, sandbox=sandbox)).passed, kind
        assert not SCRIPT.verify(task, Outcome(answer=None, sandbox=sandbox)).passed, kind


@pytest.mark.parametrize("check, match", [
    ("def check(answer, args):\n    return 1 / 0\n", "ZeroDivisionError"),
    ("def check(answer, args):\n    import time\n    time.sleep(60)\n", "timeout"),
])
def test_a_check_that_dies_while_reading_the_workspace_is_a_failed_verdict(sandbox, check, match):
    # it had read the policy's files (or run its programs): the policy may have caused it
    task = Task(domain="terminal.t", prompt="p", env="tools",
                verifier={"check": check, "args": {}, "timeout_s": 0.5})
    v = SCRIPT.verify(task, Outcome(answer="", sandbox=sandbox))
    assert not v.passed and v.details["grader_failed"] and match in v.details["reason"]


@pytest.mark.parametrize("check, match", [
    ("def check(answer, args):\n    return {'ok': True}\n", "passed"),
    ("x = 1\n", "check"),
])
def test_a_broken_check_script_is_an_infrastructure_error(sandbox, check, match):
    task = Task(domain="terminal.t", prompt="p", env="tools",
                verifier={"check": check, "args": {}, "timeout_s": 0.5})
    with pytest.raises(VerifierError, match=match):
        SCRIPT.verify(task, Outcome(answer="", sandbox=sandbox))


def test_git_check_inspects_the_repository_with_plumbing(sandbox):
    d = DOMAINS["terminal.git.init-commit"]
    task = d.task(1)
    assert play_actions(d, task, d.oracle(task), sandbox=sandbox).passed
    # repository-local settings that run programs must not run during grading
    sandbox.run("git config core.fsmonitor 'touch hooked #' && git config core.pager 'touch hooked #'")
    v = SCRIPT.verify(task, Outcome(answer="", sandbox=sandbox))
    assert v.passed and "hooked" not in sandbox.list_files()
