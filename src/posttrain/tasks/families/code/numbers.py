"""Function templates over integers (domains `code.num.*`)."""

from __future__ import annotations

import math

from posttrain.tasks.families.code.template import FunctionTemplate


def _base_solution(b: int, reverse: bool = False) -> str:
    step = "out = out + digits[n % {b}]" if reverse else "out = digits[n % {b}] + out"
    return f"""def to_base(n):
    digits = '0123456789abcdefghijklmnopqrstuvwxyz'
    if n == 0:
        return '0'
    sign = '-' if n < 0 else ''
    n = abs(n)
    out = ''
    while n:
        {step.format(b=b)}
        n //= {b}
    return sign + out
"""


BASE = FunctionTemplate(
    name="num.base", entry="to_base", signature="to_base(n: int) -> str",
    params=lambda r: {"b": r.randint(2, 36)},
    describe=lambda p: (f"returns the base-{p['b']} representation of n as a string (digits 0-9 then "
                        f"lowercase letters, a leading '-' for a negative n, '0' for zero)"),
    solution=lambda p: _base_solution(p["b"]),
    wrong=lambda p: _base_solution(p["b"], reverse=True),
    case=lambda r, p: [r.choice([r.randint(-500, 500), r.randint(-10 ** 6, 10 ** 6)])],
    edge=lambda p: [[0], [p["b"]], [-1]],
    bug=lambda p: ("out = digits[n % {b}] + out".format(b=p["b"]), "out = out + digits[n % {b}]".format(b=p["b"])),
)

FIZZ_WORDS = ("Fizz", "Buzz", "Foo", "Bar", "Ping", "Pong", "Zip", "Zap")


def _fizz_params(r) -> dict:
    a, b = sorted(r.sample(range(2, 10), 2))
    w1, w2 = r.sample(FIZZ_WORDS, 2)
    return {"a": a, "b": b, "w1": w1, "w2": w2}


def _fizz_solution(p, both_first: bool = True) -> str:
    both = (f"        if i % {p['a']} == 0 and i % {p['b']} == 0:\n"
            f"            out.append('{p['w1']}{p['w2']}')\n")
    singles = (f"        {'elif' if both_first else 'if'} i % {p['a']} == 0:\n"
               f"            out.append('{p['w1']}')\n"
               f"        elif i % {p['b']} == 0:\n            out.append('{p['w2']}')\n")
    if not both_first:
        both = both.replace("        if", "        elif", 1)
    body = both + singles if both_first else singles + both
    return f"def fizz(n):\n    out = []\n    for i in range(1, n + 1):\n{body}        else:\n            out.append(str(i))\n    return out\n"


FIZZ = FunctionTemplate(
    name="num.fizz", entry="fizz", signature="fizz(n: int) -> list[str]",
    params=_fizz_params,
    describe=lambda p: (f"returns a list with one string per number i from 1 to n: "
                        f"'{p['w1']}{p['w2']}' if i is a multiple of both {p['a']} and {p['b']}, "
                        f"'{p['w1']}' if it is a multiple of {p['a']} only, '{p['w2']}' if of "
                        f"{p['b']} only, else str(i)"),
    solution=lambda p: _fizz_solution(p),
    wrong=lambda p: _fizz_solution(p, both_first=False),
    case=lambda r, p: [r.randint(0, math.lcm(p["a"], p["b"]) + 12)],
    edge=lambda p: [[0], [math.lcm(p["a"], p["b"])]],
    bug=lambda p: (f"i % {p['a']} == 0 and i % {p['b']} == 0", f"i % {p['a']} == 0 and i % {p['b']} == 1"),
    split_by=("a", "b"),  # the words are names: 'Buzz' or 'Zap' for multiples of 7 is one problem
)

_DIGIT_OPS = {"sum": ("sum", "sum(ds)"), "product": ("product", "math.prod(ds)"),
              "max": ("largest", "max(ds)"),
              "alternating": ("alternating sum (first digit minus second plus third ..., starting "
                              "from the most significant digit)",
                              "sum(d if i % 2 == 0 else -d for i, d in enumerate(ds))")}


def _digits_solution(op: str, base: int, drop_leading: bool = False) -> str:
    cond = f"n >= {base}" if drop_leading else "n"
    return f"""import math


def digits(n):
    ds = []
    while {cond}:
        ds.append(n % {base})
        n //= {base}
    ds = ds[::-1] or [0]
    return {_DIGIT_OPS[op][1]}
"""


DIGITS = FunctionTemplate(
    name="num.digits", entry="digits", signature="digits(n: int) -> int",
    params=lambda r: {"op": r.choice(sorted(_DIGIT_OPS)), "base": r.choice([2, 3, 5, 8, 10, 16])},
    describe=lambda p: (f"returns the {_DIGIT_OPS[p['op']][0]} of the digits of the non-negative "
                        f"integer n written in base {p['base']} (n = 0 has the single digit 0)"),
    solution=lambda p: _digits_solution(p["op"], p["base"]),
    wrong=lambda p: _digits_solution(p["op"], p["base"], drop_leading=True),
    case=lambda r, p: [r.randint(0, 10 ** r.randint(1, 7))],
    edge=lambda p: [[0], [p["base"] - 1]],
)


def _divisible_params(r) -> dict:
    while True:
        a, b = r.randint(2, 12), r.randint(2, 12)
        if a % b:  # b dividing a would make every answer 0
            return {"a": a, "b": b}


def _divisible_solution(a: int, b: int, off: int = 1) -> str:
    return (f"def count_between(lo, hi):\n    return sum(1 for x in range(lo, hi + {off}) "
            f"if x % {a} == 0 and x % {b} != 0)\n")


DIVISIBLE = FunctionTemplate(
    name="num.divisible", entry="count_between", signature="count_between(lo: int, hi: int) -> int",
    params=_divisible_params,
    describe=lambda p: (f"returns how many integers x with lo <= x <= hi are divisible by {p['a']} "
                        f"but not by {p['b']} (0 when lo > hi)"),
    solution=lambda p: _divisible_solution(p["a"], p["b"]),
    wrong=lambda p: _divisible_solution(p["a"], p["b"], 0),
    case=lambda r, p: (lambda lo: [lo, lo + r.randint(-2, 150)])(r.randint(-60, 100)),
    edge=lambda p: [[p["a"], p["a"]], [5, 4]],
)


def _seq_params(r) -> dict:
    while True:
        p = {"p": r.randint(1, 3), "q": r.choice([-2, -1, 1, 2, 3]), "a0": r.randint(0, 2),
             "a1": r.randint(1, 3)}
        if not (p["a0"] == p["a1"] and p["p"] + p["q"] == 1):  # that sequence is constant
            return p


def _seq_solution(p, shift: int = 0) -> str:
    return f"""def term(n):
    a, b = {p['a0']}, {p['a1']}
    for _ in range(n{' - 1' if shift else ''}):
        a, b = b, {p['p']} * b + {p['q']} * a
    return a
"""


SEQUENCE = FunctionTemplate(
    name="num.sequence", entry="term", signature="term(n: int) -> int",
    params=_seq_params,
    describe=lambda p: (f"returns a(n) for n >= 0, where a(0) = {p['a0']}, a(1) = {p['a1']} and "
                        f"a(n) = {p['p']}*a(n-1) + ({p['q']})*a(n-2)"),
    solution=lambda p: _seq_solution(p),
    wrong=lambda p: _seq_solution(p, 1),
    case=lambda r, p: [r.randint(0, 30)],
    edge=lambda p: [[0], [1], [2]],
)


def _group_solution(sep: str, g: int, neg: str, from_left: bool = False) -> str:
    split = (f"    while s:\n        parts.append(s[:{g}])\n        s = s[{g}:]\n" if from_left else
             f"    while s:\n        parts.insert(0, s[-{g}:])\n        s = s[:-{g}]\n")
    wrap = "'(' + body + ')'" if neg == "parens" else "'-' + body"
    return f"""def group_digits(n):
    s = str(abs(n))
    parts = []
{split}    body = {sep!r}.join(parts)
    return {wrap} if n < 0 else body
"""


GROUP_DIGITS = FunctionTemplate(
    name="num.group-digits", entry="group_digits", signature="group_digits(n: int) -> str",
    params=lambda r: {"sep": r.choice([",", ".", " ", "_", "'"]), "g": r.randint(2, 4),
                      "neg": r.choice(["minus", "parens"])},
    describe=lambda p: (f"writes n with its digits in groups of {p['g']} counted from the right, "
                        f"separated by {p['sep']!r} (e.g. {p['g'] + 2} digits give a group of 2 then "
                        f"one of {p['g']}); a negative n "
                        + ("gets a leading '-'" if p["neg"] == "minus" else
                           "is written without '-' inside parentheses")),
    solution=lambda p: _group_solution(p["sep"], p["g"], p["neg"]),
    wrong=lambda p: _group_solution(p["sep"], p["g"], p["neg"], from_left=True),
    case=lambda r, p: [r.randint(-10 ** r.randint(1, 9), 10 ** r.randint(1, 10))],
    edge=lambda p: [[0], [-7]],
)

TEMPLATES = (BASE, FIZZ, DIGITS, DIVISIBLE, SEQUENCE, GROUP_DIGITS)
