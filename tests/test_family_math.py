"""The math family: every domain's oracle passes and negatives fail; splits are content-disjoint."""

from __future__ import annotations

import re

import pytest

from posttrain.tasks.families import math as math_family
from posttrain.tasks.families.common import content_split
from posttrain.tasks.families.math_word import SPLIT_BY
from posttrain.values.task import canonical_json
from posttrain.verifiers.base import Outcome

DOMAINS = math_family.domains()


def _grade(domain, task, answer: str) -> bool:
    return domain.verifier.verify(task, Outcome(answer=answer)).passed


def test_at_least_40_domains_with_unique_names():
    names = [d.name for d in DOMAINS]
    assert len(names) >= 40 and len(set(names)) == len(names)
    assert {"math.add.d1", "math.sub.d5", "math.mul.d3", "math.div.d2", "math.word.interest"} <= set(names)


@pytest.mark.parametrize("domain", DOMAINS, ids=lambda d: d.name)
def test_oracle_passes_and_negatives_fail(domain):
    for split in ("train", "eval"):
        for seed in (0, 1):
            task = domain.task(seed, split)
            assert task.split == split and task.env == "single" and task.domain == domain.name
            if domain.name.startswith("math.word."):  # a word problem's split goes by its numbers
                keys = SPLIT_BY.get(domain.name.removeprefix("math.word."))  # or by some of them
                numbers = {k: v for k, v in task.reference.items() if k != "answer" and (keys is None or k in keys)}
                assert content_split(f"{domain.name}\x00{canonical_json(numbers)}") == split
            else:
                assert content_split(task.prompt) == split
            assert _grade(domain, task, domain.oracle(task)[-1])
            assert _grade(domain, task, "  " + domain.oracle(task)[-1] + "\n")  # whitespace stripped
            negatives = domain.negatives(task)
            assert negatives["empty"] == [""] and "wrong" in negatives
            for name, actions in negatives.items():
                assert not _grade(domain, task, actions[-1]), (name, task.prompt)


@pytest.mark.parametrize("name,shape", [
    ("math.add.d2", r"\d\d\+\d\d="), ("math.sub.d2", r"\d\d-\d\d="), ("math.mul.d2", r"\d\d\*\d="),
    ("math.div.d2", r"\d+/\d="), ("math.mod.d3", r"\d{3}%\d\d?="), ("math.max.d1", r"max\(\d,\d,\d\)="),
    ("math.min.d2", r"min\(\d\d,\d\d,\d\d\)="), ("math.gcd.d2", r"gcd\(\d+,\d+\)="),
    ("math.square.d3", r"\d{3}\^2=")])
def test_prompt_shapes_are_the_documented_ones(name, shape):
    # A tiny model's pretraining corpus is built around exactly these shapes.
    domain = next(d for d in DOMAINS if d.name == name)
    for seed in range(5):
        task = domain.task(seed)
        assert re.fullmatch(shape, task.prompt), task.prompt
        assert re.fullmatch(r"0|[1-9]\d*", task.reference["answer"])


def test_arithmetic_answers_are_right():
    for seed in range(20):
        t = next(d for d in DOMAINS if d.name == "math.sub.d3").task(seed)
        a, b = map(int, t.prompt[:-1].split("-"))
        assert a >= b and t.reference["answer"] == str(a - b)
        t = next(d for d in DOMAINS if d.name == "math.div.d3").task(seed, "eval")
        a, b = map(int, t.prompt[:-1].split("/"))
        assert a % b == 0 and t.reference["answer"] == str(a // b) and 100 <= a // b <= 999


def test_generation_is_deterministic_and_seeded():
    domain = DOMAINS[0]
    a, b = domain.task(7, "train"), domain.task(7, "train")
    assert a.model_dump_json() == b.model_dump_json() and a.hash == b.hash
    prompts = {domain.task(s, "train").prompt for s in range(30)}
    assert len(prompts) > 10  # seeds differ


def test_train_and_eval_are_disjoint_by_content():
    domain = next(d for d in DOMAINS if d.name == "math.add.d1")  # 100 problems in all
    train = {domain.task(s, "train").prompt for s in range(300)}
    evals = {domain.task(s, "eval").prompt for s in range(300)}
    assert train and evals and not train & evals
    assert 0.1 < len(evals) / (len(train) + len(evals)) < 0.35


def test_word_problem_tolerance_is_what_the_docs_say():
    domain = next(d for d in DOMAINS if d.name == "math.word.interest")
    task = domain.task(0)
    ref = float(task.reference["answer"])
    assert _grade(domain, task, f"{ref + 0.004:.3f}")
    assert not _grade(domain, task, f"{ref + 0.01:.2f}")
    assert not _grade(domain, task, "nan") and not _grade(domain, task, "inf")


def test_word_problems_that_differ_only_in_their_nouns_share_a_split():
    # "110 g of sugar" and "110 g of butter" for 5 people are one problem: never in both splits
    domain = next(d for d in DOMAINS if d.name == "math.word.recipe")
    numbers = {}
    for split in ("train", "eval"):
        for seed in range(300):
            ref = domain.task(seed, split).reference
            numbers.setdefault(split, set()).add((ref["n1"], ref["n2"], ref["grams"]))
    assert numbers["train"] and numbers["eval"] and not numbers["train"] & numbers["eval"]


@pytest.mark.parametrize(("op", "k"), sorted(math_family.BALANCED))
def test_skewed_small_operand_domains_draw_their_answers_uniformly(op, k):
    """min(3 digits) is 0 a third of the time: a policy learns "0"; these draw the answer first."""
    from collections import Counter

    domain = {d.name: d for d in DOMAINS}[f"math.{op}.d{k}"]
    answers = Counter(domain.task(s, "train").reference["answer"] for s in range(600))
    support = {str(a) for a in math_family.BALANCED[op, k]}
    assert set(answers) <= support and len(answers) >= len(support) - 1  # a lone problem may be eval's
    assert max(answers.values()) / 600 < 2.2 / len(support)
