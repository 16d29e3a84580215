"""The code family: generation, splits, oracles/negatives through the environment, and the
unit-tests verifier's edge cases (hangs, early exits, forged results, shadowed imports)."""

from __future__ import annotations

import pytest

from posttrain.envs import play_actions
from posttrain.sandbox.base import RunResult, SandboxError
from posttrain.tasks.families import code as code_family
from posttrain.tasks.families.code.humaneval import problems, split_ids
from posttrain.tasks.families.code.template import problem_split
from posttrain.values.task import Task
from posttrain.verifiers.base import Outcome, VerifierError
from posttrain.verifiers.candidate import encode_value, extract_code, same_value
from posttrain.verifiers.code import UNIT_TESTS

DOMAINS = {d.name: d for d in code_family.domains()}
WRITE = [d for n, d in DOMAINS.items() if d.env == "single" and n != "code.humaneval"]
REPAIR = [d for d in DOMAINS.values() if d.env == "tools"]




def test_family_has_enough_domains():
    assert len(DOMAINS) >= 31 and len(WRITE) >= 30 and len(REPAIR) >= 8
    assert "code.humaneval" in DOMAINS
    assert all(d.family == "code" and d.name.startswith("code.") for d in DOMAINS.values())


def test_generation_is_deterministic_and_splits_are_content_disjoint():
    for t in code_family.TEMPLATES:
        d = DOMAINS[f"code.{t.name}"]
        keys = {"train": set(), "eval": set()}
        for split in ("train", "eval"):
            for seed in range(4):
                task = d.task(seed, split)
                again = d.task(seed, split)
                assert task.model_dump_json() == again.model_dump_json() and task.hash == again.hash
                assert task.split == split and problem_split(t, task.reference["params"]) == split
                keys[split].add(repr(sorted(task.reference["params"].items())))
                assert "```python" in task.prompt and t.entry in task.prompt
        assert not keys["train"] & keys["eval"], t.name


def test_write_domains_oracle_passes_and_negatives_fail(sandbox):
    for i, d in enumerate(WRITE):
        task = d.task(i % 3, "eval" if i % 2 else "train")
        verdict = play_actions(d, task, d.oracle(task), sandbox=sandbox)
        assert verdict.passed, (d.name, dict(verdict.details))
        negatives = d.negatives(task)
        assert {"empty", "wrong"} <= set(negatives)
        # every generated task is built so that its wrong version fails a hidden case (see
        # template.make_cases); through the environment, a sample of them:
        for name in (negatives if i % 15 == 0 else ("wrong",) if i % 5 == 0 else ()):
            v = play_actions(d, task, negatives[name], sandbox=sandbox)
            assert not v.passed, (d.name, name)


def test_repair_domains_through_the_tools_environment(sandbox):
    clean = sandbox.snapshot()
    for i, d in enumerate(REPAIR):
        task = d.task(i, "train" if i % 2 else "eval")
        assert set(task.files) == {"solution.py", "test_solution.py"}
        sandbox.restore(clean)
        verdict = play_actions(d, task, d.oracle(task), sandbox=sandbox)
        assert verdict.passed, (d.name, dict(verdict.details))
        for name, actions in d.negatives(task).items() if i == 0 else ():
            sandbox.restore(clean)
            assert not play_actions(d, task, actions, sandbox=sandbox).passed, (d.name, name)
    # the buggy file really fails its visible tests
    sandbox.restore(clean)
    task = REPAIR[0].task(5)
    for path, text in task.files.items():
        sandbox.write_file(path, text)
    assert not sandbox.run("python3 test_solution.py").ok


def test_humaneval_split_and_sampled_canonical_solutions(sandbox):
    assert len(problems()) == 164
    evals, trains = split_ids("eval"), split_ids("train")
    assert len(evals) == 33 and len(trains) == 131 and not set(evals) & set(trains)
    d = DOMAINS["code.humaneval"]
    assert {d.task(s, "eval").reference["task_id"] for s in range(33)} == set(evals)
    for seed in range(0, 131, 7):  # 19 train problems + one eval below
        task = d.task(seed, "train")
        v = play_actions(d, task, d.oracle(task), sandbox=sandbox)
        assert v.passed, (task.reference["task_id"], dict(v.details))
        if seed == 0:
            for name, actions in d.negatives(task).items():
                assert not play_actions(d, task, actions, sandbox=sandbox).passed, name
    task = d.task(3, "eval")
    body = task.reference["solution"][len(problems()[task.reference["task_id"]]["prompt"]):]
    assert play_actions(d, task, [body], sandbox=sandbox).passed  # a bare completion counts too


def _io_task(timeout: float = 1.5) -> Task:
    cases = [[[1, 2, 3]], [[]], [[5, -5, 7]]]
    return Task(domain="code.t", prompt="p", verifier={
        "mode": "io", "entry_point": "f", "cases": cases, "timeout_s": timeout,
        "expected": [encode_value(sum(c[0])) for c in cases]})


@pytest.mark.parametrize("answer, reason", [
    ("def f(xs):\n    while True:\n        pass\n", "timed out"),
    ("import os\nos._exit(0)\n", "stopped before"),
    ("import sys\nsys.exit(0)\n", "failed to load"),
    ("print('PASSED 3/3')\ndef f(xs):\n    return 0\n", "wrong result"),
    ("def f(xs):\n    raise ValueError('nope')\n", "wrong result"),
    ("def f(xs):\n    return float(sum(xs)) + 0.5\n", "wrong result"),
    ("def g(xs):\n    return sum(xs)\n", "failed to load"),
    ("def f(xs):\n    print('x' * 1_000_000)\n    return sum(xs)\n", None),
    ("def f(xs):\n    while True:\n        print('x' * 1_000_000)\n", "output limit"),
])
def test_candidates_that_misbehave_fail_with_a_reason(sandbox, answer, reason):
    v = UNIT_TESTS.verify(_io_task(), Outcome(answer=answer, sandbox=sandbox))
    if reason is None:  # a flood of output is cut, not fatal, and not a pass by itself
        assert v.passed and len(v.details["output_tail"]) <= 600
        return
    assert not v.passed
    text = str(v.details.get("reason")) + str(v.details.get("first_failure")) + str(v.details.get("error"))
    assert reason in text, dict(v.details)


def test_forged_reports_and_planted_modules_do_not_pass(sandbox):
    # The candidate writes "correct-looking" report lines to every descriptor, then exits 0.
    forge = ("import os, json\nfor fd in range(3, 20):\n    try:\n"
             "        os.write(fd, b'{\"i\": 0, \"out\": 1}\\n{\"ok\": true}\\n')\n"
             "    except OSError:\n        pass\nos._exit(0)\n")
    assert not UNIT_TESTS.verify(_io_task(), Outcome(answer=forge, sandbox=sandbox)).passed
    # A planted json.py / subprocess.py in the workspace is never imported by the graders.
    sandbox.write_file("json.py", "raise SystemExit('shadowed')\n")
    sandbox.write_file("subprocess.py", "raise SystemExit('shadowed')\n")
    try:
        assert UNIT_TESTS.verify(_io_task(), Outcome(answer="def f(xs): return sum(xs)",
                                                     sandbox=sandbox)).passed
    finally:
        sandbox.run("rm -f json.py subprocess.py")
    # check mode: a candidate that prints or writes the pass token format cannot guess the token
    task = Task(domain="code.t", prompt="p", verifier={
        "mode": "check", "entry_point": "f", "test": "def check(c):\n    assert c(2) == 4\n"})
    fake = ("import os\nfor fd in range(3, 20):\n    try:\n        os.write(fd, b'{\"ok\": true}\\n')\n"
            "    except OSError:\n        pass\nprint('{\"ok\": true}')\ndef f(x):\n    return 0\n")
    v = UNIT_TESTS.verify(task, Outcome(answer=fake, sandbox=sandbox))
    assert not v.passed and v.details["reason"] == "tests failed"
    assert UNIT_TESTS.verify(task, Outcome(answer="def f(x):\n    return x * 2\n", sandbox=sandbox)).passed


class _BrokenSandbox:
    """A sandbox whose warm path returns junk or fails outright."""

    def __init__(self, fail: bool) -> None:
        self.fail = fail

    def run_python(self, code, *, stdin=None, timeout=None, args=(), cache=False):
        if self.fail:
            raise SandboxError("supervisor died")
        return RunResult(exit_code=1, stdout="", stderr="Traceback: boom")


@pytest.mark.parametrize("fail", [True, False])
def test_a_grader_that_cannot_report_is_an_infrastructure_error(fail):
    with pytest.raises(VerifierError):
        UNIT_TESTS.verify(_io_task(), Outcome(answer="def f(xs): return 1", sandbox=_BrokenSandbox(fail)))


def test_bad_verifier_settings_are_infrastructure_errors(sandbox):
    task = Task(domain="code.t", prompt="p", verifier={"mode": "io", "entry_point": "f", "cases": [[1]]})
    with pytest.raises(VerifierError, match="expected"):
        UNIT_TESTS.verify(task, Outcome(answer="def f(x): return x", sandbox=sandbox))


def test_code_extraction_and_value_comparison():
    assert extract_code("```python\ndef f():\n    return 1\n```") == "def f():\n    return 1\n"
    two = "```python\nprint(f())\n```\ntext\n```python\ndef f():\n    return 2\n```"
    assert extract_code(two, "f").startswith("def f")
    assert extract_code("def f(): return 3") == "def f(): return 3"
    assert extract_code("```py\nx = 1") == "x = 1"  # an unclosed fence still counts
    assert encode_value({2: (1, 2), "a": {3}}) == {"dict": [["a", {"set": [3]}], [2, [1, 2]]]}
    assert encode_value(float("nan")) == {"float": "nan"}
    assert same_value(0.1 + 0.2, 0.3) and not same_value(3, 3.0) and not same_value(1, True)
    assert not same_value({"dict": [[1, 2]]}, {"dict": [["1", 2]]})  # key types matter
