"""`code.repair.<name>` domains: fix a one-line bug in a workspace file (multi-turn tools env).

The workspace holds `solution.py` (the reference solution with one line broken) and
`test_solution.py` (three visible tests, at least one failing). The verifier grades the final
`solution.py` against every hidden case, read from the workspace only after the episode; the
visible test file is never trusted (rewriting it to print "passed" changes nothing).
"""

from __future__ import annotations

import copy

from posttrain.tasks.domain import Domain
from posttrain.tasks.families.code.template import (
    FunctionTemplate,
    call_text,
    compile_reference,
    draw_params,
    make_cases,
    run_reference,
)
from posttrain.values.task import Split, Task, TaskLimits
from posttrain.verifiers.candidate import CANDIDATE_PRELOAD
from posttrain.verifiers.code import UNIT_TESTS

REPAIRABLE = ("list.rotate", "list.window", "list.kth", "list.best-window", "str.caesar", "str.rle",
              "str.wrap", "dict.merge", "num.base", "num.fizz")
"""templates with a `bug`, each made into a repair domain"""

REPAIR_LIMITS = TaskLimits(max_turns=8, max_tokens=512, context_tokens=4096, time_s=120.0)


def buggy_source(t: FunctionTemplate, params: dict) -> tuple[str, str, str]:
    """(buggy source, the buggy line, the fixed line)."""
    assert t.bug is not None
    good, bad = t.bug(params)
    source = t.solution(params)
    if source.count(good) != 1:
        raise RuntimeError(f"template {t.name}: bug text {good!r} must occur once in the solution")
    buggy = source.replace(good, bad, 1)
    changed = [(b, g) for b, g in zip(buggy.splitlines(), source.splitlines()) if b != g]
    if len(changed) != 1 or buggy.count(changed[0][0]) != 1:
        raise RuntimeError(f"template {t.name}: the bug must change one unique line")
    return buggy, changed[0][0], changed[0][1]


def test_file(t: FunctionTemplate, params: dict, visible: list[list]) -> str:
    ref = compile_reference(t.solution(params), t.entry)
    checks = "\n".join(f"    assert {call_text(t.entry, a)} == {ref(*copy.deepcopy(a))!r}"
                       for a in visible)
    return (f'"""Tests of solution.py: run `python3 test_solution.py`."""\n'
            f"from solution import {t.entry}\n\n\n"
            f"def test_{t.entry}():\n{checks}\n\n\n"
            f'if __name__ == "__main__":\n    test_{t.entry}()\n    print("all tests passed")\n')


def repair_domain(t: FunctionTemplate) -> Domain:
    name = f"code.repair.{t.name}"

    def generate(seed: int, split: Split) -> Task:
        params, rng = draw_params(t, name, split, seed)
        buggy, bad_line, good_line = buggy_source(t, params)
        cases = make_cases(t, params, rng, must_fail=(buggy, t.wrong(params)))
        failing = next(a for a, e in zip(cases.args, cases.expected)
                       if run_reference(buggy, t.entry, a) != e)
        visible = [failing] + [a for a in cases.args if a is not failing][:2]
        prompt = (f"solution.py defines `{t.signature}`, a function that {t.describe(params)}.\n"
                  f"It has a bug: the tests in test_solution.py fail. Fix solution.py (run "
                  f"`python3 test_solution.py` to check), then submit.")
        return Task(domain=name, prompt=prompt, env="tools", split=split, seed=seed,
                    limits=REPAIR_LIMITS, tags=("code", "repair"),
                    files={"solution.py": buggy, "test_solution.py": test_file(t, params, visible)},
                    reference={"bad_line": bad_line, "good_line": good_line,
                               "wrong": t.wrong(params), "params": params},
                    verifier={"mode": "io", "entry_point": t.entry, "cases": cases.args,
                              "expected": cases.expected, "file": "solution.py"})

    def oracle(task: Task) -> list[str]:
        ref = task.reference
        return ["<bash>python3 test_solution.py</bash>", "<bash>cat solution.py</bash>",
                f'<edit path="solution.py"><old>{ref["bad_line"]}</old><new>{ref["good_line"]}</new></edit>',
                "<bash>python3 test_solution.py</bash>\n<submit>fixed</submit>"]

    def negatives(task: Task) -> dict[str, list[str]]:
        return {"empty": ["<submit></submit>"],
                "wrong": [f'<write path="solution.py">{task.reference["wrong"]}</write>',
                          "<submit>fixed</submit>"],
                "tests-edited": ['<write path="test_solution.py">print("all tests passed")\n</write>',
                                 "<bash>python3 test_solution.py</bash>\n<submit>fixed</submit>"]}

    return Domain(name=name, family="code", env="tools", verifier=UNIT_TESTS, generate=generate,
                  oracle=oracle, negatives=negatives,
                  description=f"repair a one-line bug in {t.signature}", tags=("code", "repair"),
                  preload=CANDIDATE_PRELOAD)
