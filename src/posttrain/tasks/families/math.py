"""The `math` family: integer arithmetic one-liners and multi-step word problems.

Arithmetic domains are `math.<op>.d<k>`; prompts are compact one-liners ending in "=" (a
character-level model can learn them, a real LLM reads them plainly) and the answer is the exact
decimal string of a non-negative integer, checked by the `exact` verifier (surrounding
whitespace stripped; "085" and "85.0" fail).

What `d<k>` means per op (an operand "of k digits" is uniform over [10^(k-1), 10^k), or over
[0, 10) for k = 1):

| op | prompt | operands |
| --- | --- | --- |
| add | `37+48=` | both of k digits |
| sub | `85-37=` | both of k digits, the larger first (the result is never negative) |
| mul | `12*7=` | first of k digits, second of max(1, k-1) digits (neither 0) |
| div | `84/7=` | exact division: quotient of k digits (>= 1), divisor in [2, 10^max(1,k-1)) |
| mod | `17%5=` | first of k digits, divisor in [2, 10^max(1,k-1)) (at least 2..9) |
| max, min | `max(3,9,4)=` | three numbers of k digits |
| gcd | `gcd(12,18)=` | g * x and g * y: g of max(1, k-1) digits (>= 1, uniform), x, y in 1..12 |
| square | `12^2=` | one number of k digits, k >= 2 (d1 has too few problems to split) |

The small-operand domains of `BALANCED` (min, max, sub, div at d1; mod at d1, d2) draw their
answer uniformly first: their natural answers are skewed enough for a constant answer to pay.

Word problems are `math.word.<kind>` (see `math_word.py`), checked by the `numeric` verifier.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from math import gcd
from typing import Any

from posttrain.tasks.domain import Domain
from posttrain.tasks.families.common import Problem, balanced, single_domain
from posttrain.tasks.families.math_word import word_domains
from posttrain.verifiers.answer import EXACT

DIGITS = (1, 2, 3, 4, 5)


def _num(rng: random.Random, k: int) -> int:
    return rng.randrange(0 if k == 1 else 10 ** (k - 1), 10 ** k)


def _positive(rng: random.Random, k: int) -> int:
    """A number of k digits, >= 1 (a factor of 0 makes "0" the answer of a tenth of the tasks)."""
    return rng.randrange(10 ** (k - 1), 10 ** k)


def _small(k: int) -> int:
    """Digit count of the second operand of mul/div/mod at size k."""
    return max(1, k - 1)


def _no_carry_add(a: int, b: int) -> int:
    """a + b with every carry forgotten (digit-wise sum mod 10)."""
    out, place = 0, 1
    while a or b:
        out += ((a % 10 + b % 10) % 10) * place
        a, b, place = a // 10, b // 10, place * 10
    return out


def _no_borrow_sub(a: int, b: int) -> int:
    """a - b computed digit by digit as |da - db| (every borrow forgotten)."""
    out, place = 0, 1
    while a or b:
        out += abs(a % 10 - b % 10) * place
        a, b, place = a // 10, b // 10, place * 10
    return out


Draw = Callable[[random.Random, int], Problem]
Wrong = Callable[[Mapping[str, Any], str], Mapping[str, str]]


def _add(rng: random.Random, k: int) -> Problem:
    a, b = _num(rng, k), _num(rng, k)
    return Problem(f"{a}+{b}=", str(a + b), {"a": a, "b": b})


def _add_wrong(d: Mapping[str, Any], ans: str) -> dict[str, str]:
    return {"wrong": str(int(ans) + 1), "no_carry": str(_no_carry_add(d["a"], d["b"])),
            "subtracted": str(abs(d["a"] - d["b"]))}


def _sub(rng: random.Random, k: int) -> Problem:
    a, b = sorted((_num(rng, k), _num(rng, k)), reverse=True)
    return Problem(f"{a}-{b}=", str(a - b), {"a": a, "b": b})


def _sub_wrong(d: Mapping[str, Any], ans: str) -> dict[str, str]:
    n = int(ans)
    return {"wrong": str(n - 1 if n else 1), "no_borrow": str(_no_borrow_sub(d["a"], d["b"])),
            "added": str(d["a"] + d["b"])}


def _mul(rng: random.Random, k: int) -> Problem:
    a, b = _positive(rng, k), _positive(rng, _small(k))
    return Problem(f"{a}*{b}=", str(a * b), {"a": a, "b": b})


def _mul_wrong(d: Mapping[str, Any], ans: str) -> dict[str, str]:
    return {"wrong": str(int(ans) + 1), "added": str(d["a"] + d["b"]),
            "last_digit_only": str(d["a"] * (d["b"] % 10))}


def _div(rng: random.Random, k: int) -> Problem:
    q, b = max(1, _num(rng, k)), rng.randrange(2, max(10, 10 ** _small(k)))
    return Problem(f"{q * b}/{b}=", str(q), {"a": q * b, "b": b})


def _div_wrong(d: Mapping[str, Any], ans: str) -> dict[str, str]:
    return {"wrong": str(int(ans) + 1), "off_by_one_low": str(int(ans) - 1)}


def _mod(rng: random.Random, k: int) -> Problem:
    a, b = _num(rng, k), rng.randrange(2, max(10, 10 ** _small(k)))
    return Problem(f"{a}%{b}=", str(a % b), {"a": a, "b": b})


def _mod_wrong(d: Mapping[str, Any], ans: str) -> dict[str, str]:
    return {"wrong": str((int(ans) + 1) % d["b"]), "quotient": str(d["a"] // d["b"])}


def _extreme(op: str) -> Draw:
    pick = max if op == "max" else min

    def draw(rng: random.Random, k: int) -> Problem:
        xs = [_num(rng, k) for _ in range(3)]
        return Problem(f"{op}({','.join(map(str, xs))})=", str(pick(xs)), {"xs": xs})

    return draw


def _extreme_wrong(op: str) -> Wrong:
    other = min if op == "max" else max

    def wrong(d: Mapping[str, Any], ans: str) -> dict[str, str]:
        xs = d["xs"]
        return {"wrong": str(other(xs)), "first": str(xs[0]), "last": str(xs[-1])}

    return wrong


def _gcd(rng: random.Random, k: int) -> Problem:
    g = _positive(rng, _small(k))
    a, b = g * rng.randint(1, 12), g * rng.randint(1, 12)
    return Problem(f"gcd({a},{b})=", str(gcd(a, b)), {"a": a, "b": b})


def _gcd_wrong(d: Mapping[str, Any], ans: str) -> dict[str, str]:
    return {"wrong": str(int(ans) + 1), "smaller": str(min(d["a"], d["b"])),
            "lcm": str(d["a"] * d["b"] // int(ans))}


def _square(rng: random.Random, k: int) -> Problem:
    a = _num(rng, k)
    return Problem(f"{a}^2=", str(a * a), {"a": a})


def _square_wrong(d: Mapping[str, Any], ans: str) -> dict[str, str]:
    return {"wrong": str(int(ans) + 1), "doubled": str(2 * d["a"])}


# op -> (draw, wrong answers, digit sizes, one-line description)
OPS: dict[str, tuple[Draw, Wrong, tuple[int, ...], str]] = {
    "add": (_add, _add_wrong, DIGITS, "sum of two integers"),
    "sub": (_sub, _sub_wrong, DIGITS, "difference of two integers, larger first"),
    "mul": (_mul, _mul_wrong, DIGITS, "product of two integers"),
    "div": (_div, _div_wrong, DIGITS, "exact integer division"),
    "mod": (_mod, _mod_wrong, DIGITS, "remainder of integer division"),
    "max": (_extreme("max"), _extreme_wrong("max"), DIGITS, "largest of three integers"),
    "min": (_extreme("min"), _extreme_wrong("min"), DIGITS, "smallest of three integers"),
    "gcd": (_gcd, _gcd_wrong, DIGITS, "greatest common divisor of two integers"),
    "square": (_square, _square_wrong, (2, 3, 4, 5), "square of an integer"),
}


BALANCED: dict[tuple[str, int], range] = {
    ("min", 1): range(10), ("max", 1): range(10), ("sub", 1): range(10), ("div", 1): range(1, 10),
    ("mod", 1): range(9), ("mod", 2): range(9),
}
"""(op, k) -> the answers drawn uniformly (`common.balanced`): the small-operand domains whose
natural answers are skewed enough for a constant answer to pay (min of three digits is 0 a
third of the time; `posttrain tasks check` calls such a domain guessable)"""


def _arith_domain(op: str, k: int) -> Domain:
    draw, wrong, _, description = OPS[op]

    def drawer(rng: random.Random) -> Problem:
        return draw(rng, k)

    answers = BALANCED.get((op, k))
    return single_domain(f"math.{op}.d{k}", EXACT, balanced(drawer, [str(a) for a in answers]) if answers else drawer,
                         wrong,
                         description=f"{description} ({k}-digit operands)",
                         tags=("math", "arithmetic"))


def domains() -> list[Domain]:
    out = [_arith_domain(op, k) for op, (_, _, sizes, _) in OPS.items() for k in sizes]
    return out + word_domains()
