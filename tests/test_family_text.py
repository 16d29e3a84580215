"""The text family: documented prompt shapes, oracle/negatives, content-disjoint splits."""

from __future__ import annotations

import pytest

from posttrain.tasks.families import text as text_family
from posttrain.tasks.families.common import content_split
from posttrain.verifiers.base import Outcome

DOMAINS = text_family.domains()
BY_NAME = {d.name: d for d in DOMAINS}


def _grade(domain, task, answer: str) -> bool:
    return domain.verifier.verify(task, Outcome(answer=answer)).passed


def test_at_least_40_domains():
    assert len(DOMAINS) >= 40
    assert {"text.reverse.l3", "text.caesar.l8", "text.dedupe.l5", "text.rotate.l5"} <= set(BY_NAME)


@pytest.mark.parametrize("domain", DOMAINS, ids=lambda d: d.name)
def test_oracle_passes_and_negatives_fail(domain):
    for split in ("train", "eval"):
        for seed in (0, 1):
            task = domain.task(seed, split)
            assert content_split(task.prompt) == split and task.prompt.endswith("=")
            assert "\n" not in task.prompt
            assert _grade(domain, task, domain.oracle(task)[-1] + " \n")
            for name, actions in domain.negatives(task).items():
                assert not _grade(domain, task, actions[-1]), (name, task.prompt)


def _answer(name: str, seed: int = 0) -> tuple[str, str]:
    task = BY_NAME[name].task(seed)
    return task.prompt, task.reference["answer"]


@pytest.mark.parametrize("seed", range(5))
def test_answers_follow_the_documented_semantics(seed):
    prompt, ans = _answer("text.reverse.l5", seed)
    assert prompt == f"reverse {ans[::-1]}="
    prompt, ans = _answer("text.sort.l8", seed)
    assert ans == "".join(sorted(prompt[5:-1]))
    prompt, ans = _answer("text.caesar.l3", seed)
    shift, word = prompt[len("caesar+"):-1].split(" ")
    assert ans == "".join(chr((ord(c) - 97 + int(shift)) % 26 + 97) for c in word)
    prompt, ans = _answer("text.count.l8", seed)
    letter, word = prompt[len("count "):-1].split(" in ")
    assert ans == str(word.count(letter))
    prompt, ans = _answer("text.dedupe.l8", seed)
    word = prompt[len("dedupe "):-1]
    assert set(ans) == set(word) and len(ans) == len(set(word)) and ans[0] == word[0]
    prompt, ans = _answer("text.rotate.l5", seed)
    n, word = prompt[len("rotate"):-1].split(" ")
    assert ans == word[int(n):] + word[:int(n)]
    prompt, ans = _answer("text.swapcase.l8", seed)
    assert ans == prompt[len("swapcase "):-1].swapcase()
    prompt, ans = _answer("text.vowels.l5", seed)
    assert prompt.startswith("remove vowels ") and ans and not set(ans) & set("aeiou")


def test_case_matters_for_exact_answers():
    domain = BY_NAME["text.upper.l5"]
    task = domain.task(0)
    assert _grade(domain, task, task.reference["answer"])
    assert not _grade(domain, task, task.reference["answer"].lower())


def test_generation_is_deterministic_and_splits_disjoint():
    domain = BY_NAME["text.length.l3"]
    assert domain.task(5, "eval").model_dump_json() == domain.task(5, "eval").model_dump_json()
    train = {domain.task(s, "train").prompt for s in range(200)}
    evals = {domain.task(s, "eval").prompt for s in range(200)}
    assert not train & evals and len(train) > 50 and len(evals) > 50


def test_count_answers_are_uniform_so_no_constant_answer_pays():
    """Letters drawn at random made "0" the answer of ~45% of `text.count.l3` (a policy learned
    it instead of counting); the count is drawn first."""
    from collections import Counter

    domain = {d.name: d for d in text_family.domains()}["text.count.l8"]
    answers = Counter(domain.task(s, "train").reference["answer"] for s in range(900))
    assert set(answers) == {str(k) for k in range(9)}
    assert max(answers.values()) / 900 < 0.16  # uniform: 1/9 = 0.11
    for s in range(50):
        task = domain.task(s, "train")
        word, letter = task.reference["word"], task.reference["letter"]
        assert len(word) == 8 and str(word.count(letter)) == task.reference["answer"]
