"""Helpers shared by the generated families: content-disjoint splits and single-answer domains.

Train and eval are disjoint *by content*, not by seed: a problem belongs to the eval split iff a
hash of its canonical content (the prompt plus the files, nothing else) falls in a fixed 20%
bucket. Generators draw from `random.Random(f"{domain}/{split}/{seed}")` and reject problems of
the other split, so the same (seed, split) always yields the same task, and no eval problem can
ever be generated as a training one (in any domain: the domain name is not part of the hash).

A generator whose problems differ in text that does not change them (names, ingredients) gives
each `Problem` an `identity` (e.g. its numbers), and the split is decided by that instead.

Both splits also hold their common answers in the same shares (`strata_of`). A hash split of a
small problem space does not: `math.sub.d1` has 55 problems, and its eval fifth happened to hold
the only problem whose answer is 9, so a constant "9" passed 36% of eval tasks and 11% of train
ones; `rg.self_reference` repeats a few problems so often that "1" was 36% of eval draws and 21%
of train ones. A policy learns the answers that pay in training; with shifted splits the
evaluation rewarded or punished that prior by chance (a breadth run's worst regressions,
`math.div.d1` on 4 tasks and `rg.self_reference` on 20, were such domains; on all their distinct
eval problems the trained policy had not regressed). So a domain whose draws have frequent
answers draws its answer class first, in the shares of all its problems, then a problem of that
class in the split (a class the split has no problem of is left out and the others renormalised).
The class of each seed follows a low-discrepancy sequence, not a random draw, so every seed range
0..N-1 (an evaluation's tasks) holds each class in its share to within two tasks.

What this does *not* guarantee: that two train seeds give different problems (small domains
repeat), or that near-duplicates (e.g. "37+48=" and "48+37=") land in the same split.
"""

from __future__ import annotations

import hashlib
import random
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any, TypeVar

from posttrain.tasks.domain import Domain
from posttrain.values.task import Split, Task, TaskLimits, canonical_json
from posttrain.verifiers.base import Verifier

T = TypeVar("T")

EVAL_PERCENT = 20
"""share of all problems (by content hash) that belong to the eval split"""

MAX_DRAWS = 20_000
"""rejection-sampling budget of one task; a domain that exhausts it has too few problems"""

STRATUM_SHARE = 0.02
"""an answer at least this common among a domain's draws is a stratum of its own (`strata_of`):
common enough for a constant answer to pay"""
STRATA_PROBE = 2_000
"""draws (from a fixed RNG) an answer's share and its splits are measured on"""
OTHER: str | None = None
"""the stratum of every answer rarer than STRATUM_SHARE"""


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


@dataclass(frozen=True)
class Strata:
    """A domain's answer classes, their shares, and the splits that have each (`strata_of`)."""

    shares: Mapping[str | None, float]
    """answer (OTHER: all rare answers) -> its share of the domain's draws"""
    splits: Mapping[str | None, tuple[Split, ...]]
    """answer -> the splits the probe found it in; a split draws only its own classes, their
    shares renormalised (a problem space too small to give an answer to both splits keeps it in
    the one that has it: dropping it would remove real problems, `math.sub.d1`'s 6 to 9)"""

    def of(self, answer: str) -> str | None:
        """The class of an answer."""
        return answer if answer in self.shares else OTHER

    def classes(self, split: Split) -> tuple[list[str | None], list[float]]:
        """The classes of `split` and their weights."""
        classes = [c for c in self.shares if split in self.splits[c]]
        return classes, [self.shares[c] for c in classes]

    def to_json(self) -> dict[str, Any]:
        return {"classes": [[c, p, list(self.splits[c])] for c, p in self.shares.items()]}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> Strata:
        return cls(shares={c: float(p) for c, p, _ in obj["classes"]},
                   splits={c: tuple(s) for c, _, s in obj["classes"]})


def probe_answers(domain: str, draw: Callable[[random.Random], T], split_of: Callable[[T], Split | None],
                  answer_of: Callable[[T], str], probe: int = STRATA_PROBE) -> list[tuple[str, Split]]:
    """(answer, split) of `probe` draws from a fixed RNG (items of neither split left out)."""
    rng = random.Random(f"{domain}/answer-strata")
    out = []
    for _ in range(probe):
        item = draw(rng)
        split = split_of(item)
        if split is not None:
            out.append((answer_of(item), split))
    return out


def strata_of(drawn: Sequence[tuple[str, Split]]) -> Strata | None:
    """The answer strata of probed draws (`probe_answers`): each answer with at least
    STRATUM_SHARE of the draws is a class, the rest one OTHER class, each with the splits it was
    seen in. None where no answer is frequent (nothing a constant answer could exploit; the
    plain draw is kept)."""
    counts = Counter(a for a, _ in drawn)
    splits: dict[str, set[Split]] = {}
    for a, s in drawn:
        splits.setdefault(a, set()).add(s)
    n = len(drawn)
    frequent = sorted(a for a, c in counts.items() if c >= STRATUM_SHARE * n)
    if not frequent:
        return None
    shares: dict[str | None, float] = {a: counts[a] / n for a in frequent}
    where: dict[str | None, tuple[Split, ...]] = {a: _ordered(splits[a]) for a in frequent}
    rare = [a for a in counts if a not in shares]
    if rare:
        shares[OTHER] = sum(counts[a] for a in rare) / n
        where[OTHER] = _ordered(set().union(*(splits[a] for a in rare)))
    return Strata(shares=shares, splits=where)


def split_skew(drawn: Sequence[tuple[str, Split]], min_count: int = 10) -> float:
    """p-value (chi-square test of homogeneity) that the two splits of probed draws hold the
    answers they share in the same shares: each shared answer seen `min_count` times a class,
    the other shared answers one. Answers one split lacks are left out (a problem space too small
    for both splits to have them). 1.0 where there is nothing to compare."""
    from scipy.stats import chi2_contingency

    counts = {s: Counter(a for a, t in drawn if t == s) for s in ("train", "eval")}
    shared = set(counts["train"]) & set(counts["eval"])
    total = {s: sum(counts[s][a] for a in shared) for s in counts}
    keys = sorted(a for a in shared if counts["train"][a] + counts["eval"][a] >= min_count)
    table = [[counts[s][a] for a in keys] + [total[s] - sum(counts[s][a] for a in keys)] for s in counts]
    table = [[row[i] for i in range(len(row)) if table[0][i] + table[1][i] > 0] for row in table]
    if len(table[0]) < 2 or min(total.values()) == 0:
        return 1.0
    return float(chi2_contingency(table)[1])


def _ordered(splits: set[Split]) -> tuple[Split, ...]:
    return tuple(s for s in ("train", "eval") if s in splits)


def draw_in_split(domain: str, split: Split, seed: int, draw: Callable[[random.Random], T],
                  split_of: Callable[[T], Split | None], strata: Strata | None = None,
                  answer_of: Callable[[T], str] | None = None) -> tuple[T, random.Random]:
    """Rejection sampling for content-disjoint splits: draw from the task's RNG until
    `split_of(item) == split` (None: an item of neither split, drawn past). With `strata`, the
    answer class is drawn first (in its shares) and the item must have it too, `answer_of`
    giving an item's answer: both splits then hold each frequent answer in the same share.
    Returns the item and the RNG (which later draws may continue)."""
    if split not in ("train", "eval"):
        raise ValueError(f"domain {domain}: split must be 'train' or 'eval', got {split!r}")
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise ValueError(f"domain {domain}: seed must be an int, got {seed!r}")
    rng = task_rng(domain, split, seed)
    wanted = ""

    def in_class(item: T) -> bool:
        return True

    if strata is not None:
        if answer_of is None:
            raise ValueError(f"domain {domain}: answer strata need answer_of")
        classes, weights = strata.classes(split)
        want = _class_of_seed(domain, split, seed, classes, weights)
        wanted = f" with the answer class {'(other)' if want is OTHER else repr(want)}"

        def in_class(item: T) -> bool:
            return strata.of(answer_of(item)) == want

    for _ in range(MAX_DRAWS):
        item = draw(rng)
        if split_of(item) == split and in_class(item):
            return item, rng
    raise RuntimeError(f"domain {domain}: no {split} problem{wanted} in {MAX_DRAWS} draws (seed {seed}); "
                       "its problem space is too small for a content-disjoint split")


FIBONACCI = 2_654_435_769
"""2**32 / the golden ratio, rounded: seed * FIBONACCI mod 2**32 is a low-discrepancy sequence"""


def _class_of_seed(domain: str, split: Split, seed: int, classes: Sequence[str | None],
                   weights: Sequence[float]) -> str | None:
    """The answer class of a split's seed: seeds 0..N-1 hold each class in its share to within
    two tasks, whatever N (a Weyl sequence on the golden ratio, offset per domain and split,
    through the classes' cumulative shares; measured on 200 offsets for N up to 2,000, where a
    draw at random per seed strays up to 5 tasks at N = 20). Drawn at random, an evaluation of a few
    tasks holds each answer by chance (20 eval tasks of `rg.self_reference`, whose answer "1" is
    19% of its draws, hold none of it 1.4% of the time; a breadth run's focus evaluation drew
    exactly such a set, and the policy, which had learned "1", read as its worst regression)."""
    offset = int.from_bytes(hashlib.sha256(f"{domain}/{split}/answer-class".encode()).digest()[:4], "big")
    u = ((seed * FIBONACCI + offset) % 2 ** 32) / 2 ** 32 * sum(weights)
    for c, w in zip(classes, weights):
        if u < w:
            return c
        u -= w
    return classes[-1]  # rounding at the top end


def problem_split(p: Problem) -> Split:
    """The split of a generated problem: by its identity if it has one, else its prompt and files."""
    return content_split(p.prompt, p.files) if p.identity is None else content_split(p.identity)


def _problem_answer(p: Problem) -> str:
    return p.answer.strip()


def problem_strata(domain: str, draw: Callable[[random.Random], Problem]) -> Strata | None:
    return strata_of(probe_answers(domain, draw, problem_split, _problem_answer))


def draw_problem(domain: str, split: Split, seed: int, draw: Callable[[random.Random], Problem],
                 strata: Strata | None = None) -> Problem:
    """Draw problems from the task's RNG until one belongs to `split` (and, with `strata`, to the
    answer class drawn first)."""
    return draw_in_split(domain, split, seed, draw, problem_split, strata, _problem_answer)[0]


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
    A domain with frequent answers draws them in the same shares in both splits (`strata_of`,
    measured on first use in each process: a few milliseconds).
    """
    family = name.split(".", 1)[0]
    task_limits = limits or TaskLimits(max_turns=1, max_tokens=32)
    settings = dict(verifier_settings or {})
    strata = cache(lambda: problem_strata(name, draw))  # measured once per process, on first use

    def generate(seed: int, split: Split) -> Task:
        p = draw_problem(name, split, seed, draw, strata())
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
