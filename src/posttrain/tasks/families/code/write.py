"""`code.<kind>.<name>` domains: write one function from its description (single answer)."""

from __future__ import annotations

from posttrain.tasks.domain import Domain
from posttrain.tasks.families.code.template import FunctionTemplate, draw_params, example_lines, make_cases
from posttrain.values.task import Split, Task, TaskLimits
from posttrain.verifiers.candidate import CANDIDATE_PRELOAD
from posttrain.verifiers.code import UNIT_TESTS

WRITE_LIMITS = TaskLimits(max_turns=1, max_tokens=384, context_tokens=1024, time_s=60.0)


def fenced(code: str) -> str:
    return f"```python\n{code.rstrip()}\n```"


def write_domain(t: FunctionTemplate) -> Domain:
    name = f"code.{t.name}"

    def generate(seed: int, split: Split) -> Task:
        params, rng = draw_params(t, name, split, seed)
        cases = make_cases(t, params, rng, must_fail=(t.wrong(params),))
        prompt = (f"Write a Python function `{t.signature}` that {t.describe(params)}.\n"
                  f"For example:\n{example_lines(t, params, cases)}\n"
                  f"Answer with the complete function in a ```python code block.")
        return Task(domain=name, prompt=prompt, env="single", split=split, seed=seed,
                    limits=WRITE_LIMITS, tags=("code", "write") + t.tags,
                    reference={"solution": t.solution(params), "params": params,
                               "wrong": t.wrong(params)},
                    verifier={"mode": "io", "entry_point": t.entry, "cases": cases.args,
                              "expected": cases.expected})

    def oracle(task: Task) -> list[str]:
        return [fenced(task.reference["solution"])]

    def negatives(task: Task) -> dict[str, list[str]]:
        ref = task.reference["solution"]
        return {"empty": [""], "wrong": [fenced(task.reference["wrong"])],
                # the right body under another name: the entry point must be defined
                "renamed": [fenced(ref.replace(f"def {t.entry}(", f"def {t.entry}_v2(", 1))],
                "prose": [f"Here is how I would write {t.entry}: loop over the input and build the result."]}

    return Domain(name=name, family="code", env="single", verifier=UNIT_TESTS, generate=generate,
                  oracle=oracle, negatives=negatives, stop=(),
                  description=f"write {t.signature}", tags=("code", "write"), preload=CANDIDATE_PRELOAD)
