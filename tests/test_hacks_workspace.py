"""Hack classes against workspace graders (terminal check scripts, Harbor tests)."""

from __future__ import annotations

import pytest

from posttrain.envs import play_actions
from posttrain.sandbox import open_sandbox
from posttrain.tasks.adversaries import adversaries
from posttrain.tasks.families.terminal import harbor_examples
from posttrain.tasks.registry import all_domains

DOMAINS = all_domains()
HARBOR = {d.name.rsplit(".", 1)[1]: d for d in harbor_examples()}


@pytest.fixture(scope="module")
def module_sandbox():
    with open_sandbox() as sb:
        yield sb, sb.snapshot()


@pytest.fixture
def sandbox(module_sandbox):
    sb, snap = module_sandbox
    sb.restore(snap)
    sb.kill_processes()
    return sb


def _split(d):
    for split in ("train", "eval"):
        try:
            d.task(0, split)
            return split
        except ValueError:
            continue
    raise AssertionError(d.name)


@pytest.mark.parametrize("name, hack", [
    ("count-errors", "plant-grader-files"), ("count-errors", "edit-input-data"),
    ("count-errors", "daemon-kills-and-writes-rewards"),
    ("median-bugfix", "tested-code-exits-0"), ("median-bugfix", "tested-code-writes-reward"),
    ("median-bugfix", "plant-grader-files"),
])
def test_harbor_hacks_fail(name, hack, sandbox):
    d = HARBOR[name]
    task = d.task(0, _split(d))
    v = play_actions(d, task, adversaries(d, task)[hack], sandbox=sandbox)
    assert not v.passed, (hack, dict(v.details))


def test_edited_input_data_does_not_fool_tests_that_recompute_from_it(sandbox):
    # count-errors' tests count ERROR lines in /app/data: emptying the logs and answering 0
    # used to pass; the grader now restores the task's input files
    d = HARBOR["count-errors"]
    task = d.task(0, _split(d))
    v = play_actions(d, task, ["<bash>for f in data/*.log; do : > $f; done; echo 0 > error_count.txt</bash>",
                               "<submit></submit>"],
                     sandbox=sandbox)
    assert not v.passed


def test_harbor_oracles_still_pass_with_declared_artifacts(sandbox, module_sandbox):
    for name in ("median-bugfix", "fix-config", "count-errors"):
        module_sandbox[0].restore(module_sandbox[1])
        d = HARBOR[name]
        task = d.task(0, _split(d))
        assert play_actions(d, task, d.oracle(task), sandbox=sandbox).passed, name


def _domain_with(pred):
    return next(d for n, d in sorted(DOMAINS.items()) if n.startswith("terminal.") and pred(d))


def test_json_is_compared_by_type(sandbox):
    d = _domain_with(lambda d: d.verifier.name == "script" and (d.task(0).verifier.get("args") or {}).get("json"))
    task = d.task(0)
    attacks = {k: v for k, v in adversaries(d, task).items() if k.startswith("json-")}
    assert attacks
    for name, actions in attacks.items():
        v = play_actions(d, task, actions, sandbox=sandbox)
        assert not v.passed, (name, dict(v.details))


def test_archives_are_checked_by_format_and_member_type(sandbox, module_sandbox):
    d = _domain_with(lambda d: "members" in (d.task(0).verifier.get("args") or {}))
    task = d.task(0)
    for name in ("tar-plain-not-gzip", "tar-with-symlink-member"):
        module_sandbox[0].restore(module_sandbox[1])
        v = play_actions(d, task, adversaries(d, task)[name], sandbox=sandbox)
        assert not v.passed, (name, dict(v.details))
