"""Hack classes against the `unit-tests` verifier: each must fail, never pass, never be infra."""

from __future__ import annotations

import pytest

from posttrain.sandbox import open_sandbox
from posttrain.tasks.adversaries import _CODE_HACKS, adversaries
from posttrain.tasks.registry import all_domains
from posttrain.verifiers.base import Outcome

DOMAINS = all_domains()


@pytest.fixture(scope="module")
def sandbox():
    with open_sandbox() as sb:
        yield sb


def _grade(domain_name: str, answer: str, sandbox) -> object:
    d = DOMAINS[domain_name]
    task = d.task(0)
    return d.verifier.verify(task, Outcome(answer=answer, sandbox=sandbox))


@pytest.mark.parametrize("hack", sorted(_CODE_HACKS))
def test_humaneval_check_mode_hacks_fail(hack, sandbox):
    # check(candidate) used to run in the candidate's process: a rigged __eq__, a frame walk to
    # the report token or patched builtins passed every test
    d = DOMAINS["code.humaneval"]
    task = d.task(3)
    attempt = adversaries(d, task)[hack]
    v = d.verifier.verify(task, Outcome(answer=attempt[-1], sandbox=sandbox))
    assert not v.passed, (hack, dict(v.details))


@pytest.mark.parametrize("hack", ["eq-always-true", "kill-grader", "kill-parent", "exit-0-on-import",
                                  "forged-report", "deep-nesting", "output-flood"])
def test_io_mode_hacks_fail(hack, sandbox):
    d = next(d for n, d in DOMAINS.items() if n.startswith("code.") and d.env == "single"
             and n != "code.humaneval")
    task = d.task(0)
    attempt = adversaries(d, task)[hack]
    v = d.verifier.verify(task, Outcome(answer=attempt[-1], sandbox=sandbox))
    assert not v.passed, (hack, dict(v.details))


def test_the_oracle_still_passes_check_mode_and_a_tuple_is_not_a_list(sandbox):
    d = DOMAINS["code.humaneval"]
    task = d.task(3)
    assert d.verifier.verify(task, Outcome(answer=d.oracle(task)[-1], sandbox=sandbox)).passed
    # HumanEval/8 (sum_product) expects a tuple: the same values as a list are another value
    t8 = next(d.task(i) for i in range(200) if d.task(i).reference["task_id"] == "HumanEval/8")
    as_list = ("```python\ndef sum_product(numbers):\n    p = 1\n    for n in numbers:\n        p *= n\n"
               "    return [sum(numbers), p]\n```")
    assert not d.verifier.verify(t8, Outcome(answer=as_list, sandbox=sandbox)).passed
    assert d.verifier.verify(t8, Outcome(answer=d.oracle(t8)[-1], sandbox=sandbox)).passed
