"""Helpers shared by the generated families: content-disjoint splits and single-answer domains.

Train and eval are disjoint *by content*, not by seed: a problem belongs to the eval split iff a
hash of its canonical content (the prompt plus the files, nothing else) falls in a fixed 20%
bucket. Generators draw from `random.Random(f"{domain}/{split}/{seed}")` and reject problems of
the other split, so the same (seed, split) always yields the same task, and no eval problem can
ever be generated as a training one (in any domain: the domain name is not part of the hash).

A generator whose problems differ in text that does not change them (names, ingredients) gives
each `Problem` an `identity` (e.g. its numbers), and the split is decided by that instead.

What this does *not* guarantee: that two train seeds give different problems (small domains
repeat), or that near-duplicates (e.g. "37+48=" and "48+37=") land in the same split.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from posttrain.tasks.domain import Domain
from posttrain.values.task import Split, Task, TaskLimits, canonical_json
from posttrain.verifiers.base import Verifier

T = TypeVar("T")

EVAL_PERCENT = 20
"""share of all problems (by content hash) that belong to the eval split"""

MAX_DRAWS = 20_000
"""rejection-sampling budget of one task; a domain that exhausts it has too few problems"""


def content_split(prompt: str, files: Mapping[str, str] | None = None) -> Split:
    """The split a problem belongs to, from its content alone."""
    body = prompt if not files else prompt + "\x00" + canonical_json(dict(files))
    bucket = int.from_bytes(hashlib.sha256(body.encode()).digest()[:8], "big") % 100
    return "eval" if bucket < EVAL_PERCENT else "train"


def task_rng(domain: str, split: Split, seed: int) -> random.Random:
    """The only randomness a generator may use (never the global `random` state)."""
    return random.Random(f"{domain}/{split}/{seed}")


@dataclass(frozen=True)
class Problem:
    """One generated problem of a single-answer domain."""

    prompt: str
    answer: str
    """the exact expected answer text"""
    data: Mapping[str, Any] = field(default_factory=dict)
    """the problem's inputs (JSON values), stored in `reference` so negatives can be derived"""
    files: Mapping[str, str] = field(default_factory=dict)
    identity: str | None = None
    """what makes two problems the same one, when that is less than their text (a word problem
    is its numbers: "110 g of sugar" and "110 g of butter" for 5 people are one problem). The
    split is decided by it; None: by the prompt and files"""


def draw_in_split(domain: str, split: Split, seed: int, draw: Callable[[random.Random], T],
                  split_of: Callable[[T], Split | None]) -> tuple[T, random.Random]:
    """Rejection sampling for content-disjoint splits: draw from the task's RNG until
    `split_of(item) == split` (None: an item of neither split, drawn past). Returns the item and the RNG (which later draws may continue)."""
    if split not in ("train", "eval"):
        raise ValueError(f"domain {domain}: split must be 'train' or 'eval', got {split!r}")
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ValueError(f"domain {domain}: seed must be an int, got {seed!r}")
    rng = task_rng(domain, split, seed)
    for _ in range(MAX_DRAWS):
        item = draw(rng)
        if split_of(item) == split:
            return item, rng
    raise RuntimeError(f"domain {domain}: no {split} problem in {MAX_DRAWS} draws (seed {seed}); "
                       "its problem space is too small for a content-disjoint split")


def draw_problem(domain: str, split: Split, seed: int, draw: Callable[[random.Random], Problem]) -> Problem:
    """Draw problems from the task's RNG until one belongs to `split`."""
    return draw_in_split(domain, split, seed, draw,
                         lambda p: content_split(p.prompt, p.files) if p.identity is None
                         else content_split(p.identity))[0]


def balanced(draw: Callable[[random.Random], Problem], answers: Sequence[str]) -> Callable[[random.Random], Problem]:
    """`draw` with its answers made uniform over `answers`: pick one, then draw until a problem
    has it (rejection sampling, from the same RNG: deterministic per seed).

    Why: a policy under RL pressure learns a domain's commonest answer before the task. Natural
    draws are skewed (the min of three digits is 0 a third of the time, a letter is missing from
    a short word half the time), and `posttrain tasks check`'s constant-answer probe reports such
    a domain as guessable. Every answer in `answers` must be reachable by `draw`."""
    choices = list(answers)
    if not choices:
        raise ValueError("balanced: no answers to balance over")

    def out(rng: random.Random) -> Problem:
        want = rng.choice(choices)
        for _ in range(MAX_DRAWS):
            p = draw(rng)
            if p.answer == want:
                return p
        raise RuntimeError(f"balanced: no problem with the answer {want!r} in {MAX_DRAWS} draws")

    return out


def perturb(answer: str) -> str:
    """A different answer of the same shape: the last letter/digit moved by one (z->a, 9->0)."""
    chars = list(answer)
    for i in range(len(chars) - 1, -1, -1):
        c = chars[i]
        if c.isdigit():
            chars[i] = str((int(c) + 1) % 10)
            return "".join(chars)
        if "a" <= c.lower() <= "z":
            base = ord("a") if c.islower() else ord("A")
            chars[i] = chr(base + (ord(c) - base + 1) % 26)
            return "".join(chars)
    return answer + "x"


def single_domain(
    name: str,
    verifier: Verifier,
    draw: Callable[[random.Random], Problem],
    wrong: Callable[[Mapping[str, Any], str], Mapping[str, str]],
    *,
    description: str,
    tags: tuple[str, ...] = (),
    limits: TaskLimits | None = None,
    verifier_settings: Mapping[str, Any] | None = None,
) -> Domain:
    """A `single`-environment domain from a problem drawer and a wrong-answer maker.

    `wrong(data, answer)` returns named plausible wrong answers (off-by-one, a forgotten carry,
    reversed order, ...). Those equal to the answer are dropped, 'empty' is always added and
    'wrong' falls back to `perturb(answer)`, so every domain has both required negatives.
    """
    family = name.split(".", 1)[0]
    task_limits = limits or TaskLimits(max_turns=1, max_tokens=32)
    settings = dict(verifier_settings or {})

    def generate(seed: int, split: Split) -> Task:
        p = draw_problem(name, split, seed, draw)
        return Task(domain=name, prompt=p.prompt, files=dict(p.files),
                    reference={"answer": p.answer, **p.data}, verifier=settings, env="single",
                    limits=task_limits, split=split, tags=tags, seed=seed)

    def oracle(task: Task) -> list[str]:
        return [task.reference["answer"]]

    def negatives(task: Task) -> dict[str, list[str]]:
        answer = task.reference["answer"]
        data = {k: v for k, v in task.reference.items() if k != "answer"}
        out = {"empty": [""]}
        for key, value in wrong(data, answer).items():
            if value.strip() and value.strip() != answer.strip():
                out[key] = [value]
        out.setdefault("wrong", [perturb(answer)])
        return out

    return Domain(name=name, family=family, env="single", verifier=verifier, generate=generate,
                  oracle=oracle, negatives=negatives, description=description, tags=tags)
