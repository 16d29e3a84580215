"""Tiny domains built in the tests, independent of the shipped families."""

from __future__ import annotations

import random

from posttrain.tasks.domain import Domain
from posttrain.values.task import Task, TaskLimits
from posttrain.verifiers.base import Outcome, VerifierError, verdict


class ExactVerifier:
    name, version, needs_sandbox = "toy-exact", "1", False

    def verify(self, task: Task, outcome: Outcome):
        answer = (outcome.answer or "").strip()
        return verdict(self, answer == task.reference, got=answer)


class CrashingVerifier(ExactVerifier):
    name = "toy-crash"

    def verify(self, task: Task, outcome: Outcome):
        raise VerifierError("the check script died")


class FileVerifier:
    """Passes when the workspace file out.txt holds the reference."""

    name, version, needs_sandbox = "toy-file", "1", True

    def verify(self, task: Task, outcome: Outcome):
        assert outcome.sandbox is not None
        try:
            got = outcome.sandbox.read_file("out.txt").decode().strip()
        except FileNotFoundError:
            return verdict(self, False, reason="no out.txt")
        return verdict(self, got == task.reference, got=got)


def add_domain(name: str = "toy.add", verifier=None) -> Domain:
    def gen(seed: int, split: str) -> Task:
        rng = random.Random(f"{name}/{split}/{seed}")
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        return Task(domain=name, prompt=f"{a}+{b}=", reference=str(a + b), split=split, seed=seed)

    return Domain(name=name, family="toy", env="single", verifier=verifier or ExactVerifier(),
                  generate=gen, oracle=lambda t: [t.reference],
                  negatives=lambda t: {"empty": [""], "wrong": [str(int(t.reference) + 1)]})


def file_domain(name: str = "toy.file", max_turns: int = 4) -> Domain:
    def gen(seed: int, split: str) -> Task:
        rng = random.Random(f"{name}/{split}/{seed}")
        word = "".join(rng.choice("abcdef") for _ in range(5))
        return Task(domain=name, prompt="Write the reverse of the word in word.txt to out.txt.",
                    files={"word.txt": word + "\n"}, reference=word[::-1], env="tools",
                    limits=TaskLimits(max_turns=max_turns, max_tokens=256), split=split, seed=seed)

    def oracle(t: Task):
        return ['<bash>rev word.txt > out.txt</bash>', "<bash>cat out.txt</bash>", "<submit></submit>"]

    return Domain(name=name, family="toy", env="tools", verifier=FileVerifier(), generate=gen,
                  oracle=oracle, negatives=lambda t: {"empty": ["<submit></submit>"],
                                                      "wrong": ["<bash>cp word.txt out.txt</bash><submit></submit>"]})
