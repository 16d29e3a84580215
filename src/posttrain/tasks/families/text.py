"""The `text` family: string transforms over short words, `text.<op>.l<len>`.

Prompts are compact one-liners ending in "=": `<op> <word>=` (with an argument where the op
needs one). Words are lower-case ASCII letters unless the op says otherwise; the answer is the
exact output string, checked by the `exact` verifier (case-sensitive, surrounding whitespace
stripped). `l<len>` is the word length, except for `length`, whose words are 1..2*len-1 letters
long (otherwise the answer would be the domain name).

| op | prompt | answer |
| --- | --- | --- |
| reverse | `reverse abcd=` | `dcba` |
| sort | `sort dbca=` | `abcd` |
| upper | `upper abc=` | `ABC` |
| lower | `lower ABC=` | `abc` (upper-case input) |
| swapcase | `swapcase aBc=` | `AbC` (mixed-case input) |
| count | `count a in banana=` | `3` (words over a 3..6-letter alphabet, so letters repeat) |
| caesar | `caesar+3 xyz=` | `abc` (shift 1..25, wrapping) |
| dedupe | `dedupe abcab=` | `abc` (keep the first occurrence of each letter) |
| vowels | `remove vowels banana=` | `bnn` (a e i o u removed; never all vowels) |
| length | `length banana=` | `6` |
| first | `first2 abcde=` | `ab` (n in 1..len-1) |
| last | `last2 abcde=` | `de` (n in 1..len-1) |
| double | `double abc=` | `aabbcc` |
| rotate | `rotate2 abcde=` | `cdeab` (left rotation, n in 1..len-1) |
"""

from __future__ import annotations

import random
import string
from collections.abc import Callable, Mapping
from typing import Any

from posttrain.tasks.domain import Domain
from posttrain.tasks.families.common import Problem, single_domain
from posttrain.verifiers.answer import EXACT

LENGTHS = (3, 5, 8)
LOWER = string.ascii_lowercase
VOWELS = frozenset("aeiou")


def _word(rng: random.Random, n: int, alphabet: str = LOWER) -> str:
    return "".join(rng.choice(alphabet) for _ in range(n))


def _small_alphabet(rng: random.Random) -> str:
    return "".join(rng.sample(LOWER, rng.randint(3, 6)))


def _caesar(word: str, k: int) -> str:
    return "".join(chr(ord("a") + (ord(c) - ord("a") + k) % 26) for c in word)


def _dedupe(word: str) -> str:
    return "".join(dict.fromkeys(word))


# Each op: draw(rng, n) -> Problem and wrong(data, answer) -> {name: plausible wrong answer}.
def _simple(op: str, f: Callable[[str], str], wrong: Callable[[str, str], dict[str, str]],
            alphabet: Callable[[random.Random], str] = lambda rng: LOWER) -> tuple[Callable, Callable]:
    """An op whose prompt is `<op> <word>=` and whose answer is `f(word)`."""

    def draw(rng: random.Random, n: int) -> Problem:
        w = _word(rng, n, alphabet(rng))
        return Problem(f"{op} {w}=", f(w), {"word": w})

    def wrong_answers(d: Mapping[str, Any], ans: str) -> dict[str, str]:
        return wrong(d["word"], ans)

    return draw, wrong_answers


def _lower_draw(rng: random.Random, n: int) -> Problem:
    w = _word(rng, n).upper()
    return Problem(f"lower {w}=", w.lower(), {"word": w})


def _swapcase_draw(rng: random.Random, n: int) -> Problem:
    w = "".join(c.upper() if rng.random() < 0.5 else c for c in _word(rng, n))
    return Problem(f"swapcase {w}=", w.swapcase(), {"word": w})


def _count_draw(rng: random.Random, n: int) -> Problem:
    """The count is uniform over 0..n, then the word built around it: letters drawn at random
    make 0 the answer of ~45% of 3-letter words, which a policy learns instead of counting."""
    alphabet = _small_alphabet(rng)
    c, k = rng.choice(alphabet), rng.randint(0, n)
    others = alphabet.replace(c, "")
    at = set(rng.sample(range(n), k))
    w = "".join(c if i in at else rng.choice(others) for i in range(n))
    return Problem(f"count {c} in {w}=", str(k), {"word": w, "letter": c})


def _count_wrong(d: Mapping[str, Any], ans: str) -> dict[str, str]:
    return {"wrong": str(int(ans) + 1), "length": str(len(d["word"]))}


def _caesar_draw(rng: random.Random, n: int) -> Problem:
    w, k = _word(rng, n), rng.randint(1, 25)
    return Problem(f"caesar+{k} {w}=", _caesar(w, k), {"word": w, "shift": k})


def _caesar_wrong(d: Mapping[str, Any], ans: str) -> dict[str, str]:
    w, k = d["word"], d["shift"]
    return {"wrong": _caesar(w, k - 1), "backwards": _caesar(w, -k), "unchanged": w}


def _vowels_draw(rng: random.Random, n: int) -> Problem:
    while True:
        w = _word(rng, n, "aeiou" + "bcdfghlmnprst")  # vowel-rich, so removal matters
        if not set(w) <= VOWELS:
            return Problem(f"remove vowels {w}=", "".join(c for c in w if c not in VOWELS), {"word": w})


def _length_draw(rng: random.Random, n: int) -> Problem:
    w = _word(rng, rng.randint(1, 2 * n - 1))
    return Problem(f"length {w}=", str(len(w)), {"word": w})


def _slice_op(op: str) -> tuple[Callable, Callable]:
    """`first<n>`, `last<n>`, `rotate<n>`: the answer depends on the word and on n."""

    def cut(w: str, k: int) -> str:
        return {"first": w[:k], "last": w[-k:], "rotate": w[k:] + w[:k]}[op]

    def draw(rng: random.Random, n: int) -> Problem:
        w, k = _word(rng, n), rng.randint(1, n - 1)
        return Problem(f"{op}{k} {w}=", cut(w, k), {"word": w, "n": k})

    def wrong(d: Mapping[str, Any], ans: str) -> dict[str, str]:
        w, k = d["word"], d["n"]
        confused = {"first": ("last", w[-k:]), "last": ("first", w[:k]),
                    "rotate": ("rotate_right", w[-k:] + w[:-k])}[op]
        off_by_one = k + 1 if k + 1 < len(w) else k - 1
        return {"wrong": cut(w, off_by_one) if off_by_one > 0 else w, confused[0]: confused[1],
                "unchanged": w}

    return draw, wrong


def _word_wrong(f: Callable[[str], dict[str, str]]) -> Callable:
    return lambda d, ans: f(d["word"])


# op -> (draw, wrong answers, description)
OPS: dict[str, tuple[Callable, Callable, str]] = {
    "reverse": (*_simple("reverse", lambda w: w[::-1],
                         lambda w, a: {"wrong": w, "sorted": "".join(sorted(w))}), "reverse a word"),
    "sort": (*_simple("sort", lambda w: "".join(sorted(w)), lambda w, a: {"wrong": a[::-1], "unchanged": w}),
             "sort the letters alphabetically"),
    "upper": (*_simple("upper", str.upper, lambda w, a: {"wrong": w, "first_only": w[:1].upper() + w[1:]}),
              "upper-case a word"),
    "lower": (_lower_draw, _word_wrong(lambda w: {"wrong": w, "first_only": w[:1].lower() + w[1:]}),
              "lower-case a word"),
    "swapcase": (_swapcase_draw, _word_wrong(lambda w: {"wrong": w, "upper": w.upper()}),
                 "swap the case of each letter"),
    "count": (_count_draw, _count_wrong, "count one letter in a word"),
    "caesar": (_caesar_draw, _caesar_wrong, "Caesar-shift each letter forward"),
    "dedupe": (*_simple("dedupe", _dedupe, lambda w, a: {"wrong": "".join(sorted(set(w))), "unchanged": w},
                        alphabet=_small_alphabet), "drop repeated letters, keeping first occurrences"),
    "vowels": (_vowels_draw, _word_wrong(lambda w: {"wrong": w, "vowels_kept_only": "".join(
        c for c in w if c in VOWELS)}), "remove the vowels"),
    "length": (_length_draw, lambda d, a: {"wrong": str(int(a) + 1)}, "count the letters of a word"),
    "first": (*_slice_op("first"), "the first n letters"),
    "last": (*_slice_op("last"), "the last n letters"),
    "double": (*_simple("double", lambda w: "".join(c + c for c in w), lambda w, a: {"wrong": w + w, "unchanged": w}),
               "write every letter twice"),
    "rotate": (*_slice_op("rotate"), "rotate a word left by n letters"),
}


def _of_length(draw: Callable[[random.Random, int], Problem], n: int) -> Callable[[random.Random], Problem]:
    return lambda rng: draw(rng, n)


def domains() -> list[Domain]:
    return [single_domain(f"text.{op}.l{n}", EXACT, _of_length(draw, n), wrong,
                          description=f"{description} ({n} letters)", tags=("text",))
            for op, (draw, wrong, description) in OPS.items() for n in LENGTHS]
