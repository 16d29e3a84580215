"""A third-party task family in a few lines: `demo.repeat.n<k>` ("repeat ab 3=" -> "ababab")."""

from __future__ import annotations

import random

from posttrain.tasks.domain import Domain
from posttrain.values.task import Task
from posttrain.verifiers.answer import EXACT


def _domain(times: int) -> Domain:
    name = f"demo.repeat.n{times}"

    def generate(seed: int, split: str) -> Task:
        rng = random.Random(f"{name}/{split}/{seed}")
        word = "".join(rng.choice("abcdefgh") for _ in range(3))
        return Task(domain=name, prompt=f"repeat {word} {times}=", reference={"answer": word * times},
                    split=split, seed=seed)

    return Domain(name=name, family="demo", env="single", verifier=EXACT, generate=generate,
                  oracle=lambda t: [t.reference["answer"]],
                  negatives=lambda t: {"empty": [""], "wrong": [t.reference["answer"][:-1]]})


def domains() -> list[Domain]:
    return [_domain(k) for k in (2, 3)]
