"""The constant-answer probe of `posttrain tasks check`: an attack on a domain's task
distribution, not on one task.

A policy under RL pressure finds the commonest answer long before it learns the task: a 40-step
breadth run took `text.count.l3` from 0.15 to 0.46 pass@1 by answering "0" (45% of its tasks), and
the same "0" then cost the look-alike `text.count.l8` most of what it could do. Each grader passes
the constant answer only where it is right, so no per-task check sees this; the probe plays the
commonest reference answers on `guess_tasks` train tasks and reports the best one's pass rate
against the chance of a uniform answer (1 / the distinct answers seen). When even the rate's
one-sided 95% lower bound is more than `GUESS_EXCESS_LIMIT` above that chance, the domain is
*guessable*: reported, not failed (a third-party task set may be skewed by design; the project's
own generators are tested not to be). The same probe draws as many eval tasks and compares the
answers both splits have (`common.split_skew`): where their shares differ (p < SPLIT_SKEW_P), a
prior the policy learns in training is rewarded or punished by chance in every evaluation -- also
a warning (`splits differ`).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

from posttrain.tasks.domain import Domain, NoTasksInSplit
from posttrain.values.task import Split, Task
from posttrain.verifiers.base import Outcome, verify

GUESS_EXCESS_LIMIT = 0.10
"""a domain is guessable when one constant answer passes more than this share of its tasks above
the uniform chance over its answers (a yes/no task at 50/50 is not guessable; at 70/30 it is)"""

GUESS_Z = 1.645
"""the constant answer's rate is taken at its one-sided 95% lower bound (normal approximation):
a 200-task sample of a domain at the limit reads ~0.03 either side of it"""

GUESS_CANDIDATES = 3
"""how many of the commonest reference answers the constant-answer probe plays"""

SPLIT_SKEW_P = 1e-3
"""train and eval of a domain 'differ' when the chi-square test of their shared answers' shares
gives a p-value below this (the project's 96 math/text domains were 9 below it before their
answer strata, 0 after; at 200 tasks a split)"""


@dataclass
class Guess:
    """The best constant answer over a sample of a domain's train tasks."""

    answer: str
    rate: float
    """the share of the sampled tasks it passes"""
    chance: float
    """1 / the distinct reference answers of the sample: what a uniform answer mix would give"""
    tasks: int
    split_p: float | None = None
    """p-value that the train sample and as many eval tasks hold the answers they share in the
    same shares (`common.split_skew`); None when the domain has no eval split"""

    @property
    def splits_differ(self) -> bool:
        return self.split_p is not None and self.split_p < SPLIT_SKEW_P

    @property
    def excess(self) -> float:
        return self.rate - self.chance

    @property
    def guessable(self) -> bool:
        low = self.rate - GUESS_Z * math.sqrt(self.rate * (1 - self.rate) / self.tasks)
        return low - self.chance > GUESS_EXCESS_LIMIT


def guess_probe(domain: Domain, tasks: int) -> Guess | None:
    """The constant-answer attack on a directly graded domain (module docstring): the
    `GUESS_CANDIDATES` commonest reference answers (the oracle's last action) of train seeds
    0..tasks-1, each played on every one of those tasks. None when no task has a text answer
    (or the domain has no train split). A verifier that raises on an answer counts it as not
    passed: this measures the distribution; the per-task checks judge the verifier."""
    sample: list[tuple[Task, str]] = []
    for seed in range(tasks):
        try:
            task = domain.task(seed, "train")
            actions = list(domain.oracle(task))
        except NoTasksInSplit:
            return None
        except Exception:  # noqa: BLE001 - a generator bug: the per-task checks report it
            continue
        if actions and isinstance(actions[-1], str):
            sample.append((task, actions[-1]))
    if not sample:
        return None
    counts: dict[str, int] = {}
    for _, answer in sample:
        counts[answer] = counts.get(answer, 0) + 1
    best: tuple[int, str] | None = None
    for answer in sorted(counts, key=lambda a: (-counts[a], a))[:GUESS_CANDIDATES]:
        passed = 0
        for task, _ in sample:
            with contextlib.suppress(Exception):
                passed += verify(domain.verifier, task, Outcome(answer=answer)).passed
        if best is None or passed > best[0]:
            best = (passed, answer)
    assert best is not None
    return Guess(answer=best[1], rate=best[0] / len(sample), chance=1 / len(counts), tasks=len(sample),
                 split_p=_split_p(domain, [a.strip() for _, a in sample], tasks))


def _split_p(domain: Domain, train: list[str], tasks: int) -> float | None:
    """`common.split_skew` of the train sample's answers against eval seeds 0..tasks-1's."""
    from posttrain.tasks.families.common import split_skew

    drawn: list[tuple[str, Split]] = [(a, "train") for a in train]
    for seed in range(tasks):
        try:
            actions = list(domain.oracle(domain.task(seed, "eval")))
        except NoTasksInSplit:
            return None
        except Exception:  # noqa: BLE001 - a generator bug: the per-task checks report it
            continue
        if actions and isinstance(actions[-1], str):
            drawn.append((actions[-1].strip(), "eval"))
    return split_skew(drawn)
