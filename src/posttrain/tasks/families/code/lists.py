"""Function templates over lists of integers (domains `code.list.*`)."""

from __future__ import annotations

import random

from posttrain.tasks.families.code.template import FunctionTemplate


def ints(rng: random.Random, lo: int = -20, hi: int = 20, n_max: int = 10, n_min: int = 0) -> list[int]:
    return [rng.randint(lo, hi) for _ in range(rng.randint(n_min, n_max))]


def _rotate_solution(p) -> str:
    return f"""def rotate(xs):
    if not xs:
        return []
    k = ({p['shift']}) % len(xs)
    return xs[k:] + xs[:k]
"""


ROTATE = FunctionTemplate(
    name="list.rotate", entry="rotate", signature="rotate(xs: list[int]) -> list[int]",
    params=lambda r: {"dir": r.choice(["left", "right"]), "k": r.randint(1, 12)},
    describe=lambda p: (f"returns a new list: xs rotated cyclically {p['dir']} by {p['k']} "
                        f"positions ({p['k']} may exceed len(xs)); an empty list gives []"),
    solution=lambda p: _rotate_solution({"shift": p["k"] if p["dir"] == "left" else -p["k"]}),
    wrong=lambda p: _rotate_solution({"shift": -p["k"] if p["dir"] == "left" else p["k"]}),
    case=lambda r, p: [ints(r, -9, 9, 9, 1)],
    edge=lambda p: [[[]], [[7]]],
    bug=lambda p: ("k = (", "k = 1 + ("),
    split_by=('k',),
)


def _chunk_solution(n: int, last: str) -> str:
    tail = {"keep": "",
            "drop": f"    if out and len(out[-1]) < {n}:\n        out.pop()\n",
            "pad": f"    if out and len(out[-1]) < {n}:\n        out[-1] = out[-1] + [0] * ({n} - len(out[-1]))\n"}[last]
    return f"""def chunk(xs):
    out = [xs[i:i + {n}] for i in range(0, len(xs), {n})]
{tail}    return out
"""


CHUNK = FunctionTemplate(
    name="list.chunk", entry="chunk", signature="chunk(xs: list[int]) -> list[list[int]]",
    params=lambda r: {"n": r.randint(2, 9), "last": r.choice(["keep", "drop", "pad"])},
    describe=lambda p: (f"splits xs into consecutive chunks of {p['n']} elements; "
                        + {"keep": "the last chunk may be shorter",
                           "drop": "a shorter last chunk is dropped",
                           "pad": f"a shorter last chunk is padded with 0s to {p['n']} elements"}[p["last"]]),
    solution=lambda p: _chunk_solution(p["n"], p["last"]),
    wrong=lambda p: _chunk_solution(p["n"], {"keep": "drop", "drop": "keep", "pad": "keep"}[p["last"]]),
    case=lambda r, p: [ints(r, -9, 9, 3 * p["n"] + 2)],
    edge=lambda p: [[[]]],
)

_WINDOW_OPS = {"sum": "sum(w)", "max": "max(w)", "min": "min(w)", "range": "max(w) - min(w)"}
_WINDOW_NAMES = {"sum": "sum", "max": "maximum", "min": "minimum",
                 "range": "range (maximum minus minimum)"}


def _window_solution(w: int, op: str, off: int = 1) -> str:
    return f"""def window(xs):
    out = []
    for i in range(len(xs) - {w} + {off}):
        w = xs[i:i + {w}]
        out.append({_WINDOW_OPS[op]})
    return out
"""


WINDOW = FunctionTemplate(
    name="list.window", entry="window", signature="window(xs: list[int]) -> list[int]",
    params=lambda r: {"w": r.randint(2, 6), "op": r.choice(sorted(_WINDOW_OPS))},
    describe=lambda p: (f"returns the {_WINDOW_NAMES[p['op']]} of every run of {p['w']} consecutive "
                        f"elements, in order ([] when xs has fewer than {p['w']} elements)"),
    solution=lambda p: _window_solution(p["w"], p["op"]),
    wrong=lambda p: _window_solution(p["w"], p["op"], 0),
    case=lambda r, p: [ints(r, -9, 9, 10)],
    edge=lambda p: [[[]], [list(range(p["w"]))]],
    bug=lambda p: (f"- {p['w']} + 1)", f"- {p['w']})"),
)


def _limit_solution(m: int, keep: str, cmp: str = "<=") -> str:
    body = f"""    seen = {{}}
    out = []
    for x in {'xs' if keep == 'first' else 'reversed(xs)'}:
        seen[x] = seen.get(x, 0) + 1
        if seen[x] {cmp} {m}:
            out.append(x)
"""
    ret = "    return out\n" if keep == "first" else "    return out[::-1]\n"
    return "def limit(xs):\n" + body + ret


LIMIT = FunctionTemplate(
    name="list.limit", entry="limit", signature="limit(xs: list[int]) -> list[int]",
    params=lambda r: {"m": r.randint(1, 10), "keep": r.choice(["first", "last"])},
    describe=lambda p: (f"keeps only the {p['keep']} {p['m']} occurrence(s) of each value "
                        f"and drops the rest, preserving the order of the kept elements"),
    solution=lambda p: _limit_solution(p["m"], p["keep"]),
    wrong=lambda p: _limit_solution(p["m"], p["keep"], "<") if p["keep"] == "first"
    else _limit_solution(p["m"], "first"),
    case=lambda r, p: [ints(r, 0, 4, 3 * p["m"] + 6)],
    edge=lambda p: [[[]]],
)


def _kth_solution(k: int, which: str, distinct: bool = True) -> str:
    return f"""def kth(xs):
    vals = sorted({'set(xs)' if distinct else 'xs'}, reverse={which == 'largest'})
    if len(vals) < {k}:
        return None
    return vals[{k} - 1]
"""


KTH = FunctionTemplate(
    name="list.kth", entry="kth", signature="kth(xs: list[int]) -> int | None",
    params=lambda r: {"k": r.randint(1, 10), "which": r.choice(["largest", "smallest"])},
    describe=lambda p: (f"returns the {p['k']}-th {p['which']} distinct value of xs (1 = the "
                        f"{p['which']}), or None when xs has fewer than {p['k']} distinct values"),
    solution=lambda p: _kth_solution(p["k"], p["which"]),
    wrong=lambda p: (_kth_solution(p["k"], p["which"], distinct=False) if p["k"] > 1 else
                     _kth_solution(1, "smallest" if p["which"] == "largest" else "largest")),
    case=lambda r, p: [ints(r, 0, p["k"] + 4, p["k"] + 8)],
    edge=lambda p: [[[]]],
    bug=lambda p: (f"vals[{p['k']} - 1]", f"vals[{p['k']}]" if p["k"] > 1 else "vals[-1]"),
)


def _clip_solution(lo: int, hi: int, mode: str, strict: bool = False) -> str:
    if mode == "clamp":
        expr = f"max(min(x, {lo}), {hi})" if strict else f"min(max(x, {lo}), {hi})"
        return f"def clip(xs):\n    return [{expr} for x in xs]\n"
    op = "<" if strict else "<="
    return f"def clip(xs):\n    return [x for x in xs if {lo} {op} x {op} {hi}]\n"


CLIP = FunctionTemplate(
    name="list.clip", entry="clip", signature="clip(xs: list[int]) -> list[int]",
    params=lambda r: {"lo": r.randint(-20, 0), "hi": r.randint(1, 20), "mode": r.choice(["clamp", "drop"])},
    describe=lambda p: (f"returns xs with every value below {p['lo']} replaced by {p['lo']} and every "
                        f"value above {p['hi']} replaced by {p['hi']}" if p["mode"] == "clamp" else
                        f"returns the values of xs between {p['lo']} and {p['hi']} inclusive, in order"),
    solution=lambda p: _clip_solution(p["lo"], p["hi"], p["mode"]),
    wrong=lambda p: _clip_solution(p["lo"], p["hi"], p["mode"], strict=True),
    case=lambda r, p: [ints(r, -30, 30, 10) + [r.choice([p["lo"], p["hi"]])]],
    edge=lambda p: [[[]], [[p["lo"], p["hi"]]]],
)

_STEP_OPS = {"difference": "xs[i + {s}] - xs[i]", "sum": "xs[i] + xs[i + {s}]",
             "product": "xs[i] * xs[i + {s}]", "max": "max(xs[i], xs[i + {s}])"}
_STEP_TEXT = {"difference": "xs[i + {s}] - xs[i]", "sum": "xs[i] + xs[i + {s}]",
              "product": "xs[i] * xs[i + {s}]", "max": "the larger of xs[i] and xs[i + {s}]"}


def _step_solution(s: int, op: str, off: int = 0) -> str:
    return (f"def steps(xs):\n    return [{_STEP_OPS[op].format(s=s)} "
            f"for i in range(len(xs) - {s} - {off})]\n")


STEPS = FunctionTemplate(
    name="list.steps", entry="steps", signature="steps(xs: list[int]) -> list[int]",
    params=lambda r: {"s": r.randint(1, 5), "op": r.choice(sorted(_STEP_OPS))},
    describe=lambda p: (f"returns the list of {_STEP_TEXT[p['op']].format(s=p['s'])} for every i "
                        f"from 0 such that i + {p['s']} < len(xs)"),
    solution=lambda p: _step_solution(p["s"], p["op"]),
    wrong=lambda p: _step_solution(p["s"], p["op"], 1),
    case=lambda r, p: [ints(r, -9, 9, 10)],
    edge=lambda p: [[[]], [[1]]],
)


def _best_solution(n: int, goal: str, off: int = 1) -> str:
    pick = "max" if goal.startswith("max") else "min"
    ret = f"{pick}(sums)" if goal.endswith("sum") else f"sums.index({pick}(sums))"
    return f"""def best(xs):
    if len(xs) < {n}:
        return None
    sums = [sum(xs[i:i + {n}]) for i in range(len(xs) - {n} + {off})]
    return {ret}
"""


BEST = FunctionTemplate(
    name="list.best-window", entry="best", signature="best(xs: list[int]) -> int | None",
    params=lambda r: {"n": r.randint(1, 8), "goal": r.choice(["max-sum", "min-sum", "max-start", "min-start"])},
    describe=lambda p: ((f"returns the {'largest' if p['goal'].startswith('max') else 'smallest'} sum of "
                         f"{p['n']} consecutive elements of xs") if p["goal"].endswith("sum") else
                        (f"returns the index where the first run of {p['n']} consecutive elements with "
                         f"the {'largest' if p['goal'].startswith('max') else 'smallest'} sum starts"))
    + f" (None when xs has fewer than {p['n']} elements)",
    solution=lambda p: _best_solution(p["n"], p["goal"]),
    wrong=lambda p: _best_solution(p["n"], p["goal"], 0),
    case=lambda r, p: [ints(r, -10, 10, p["n"] + 8)],
    edge=lambda p: [[[]], [list(range(p["n"]))]],
    bug=lambda p: (f"- {p['n']} + 1)", f"- {p['n']})"),
)


def _interleave_solution(p: int, q: int, b_first: bool = False) -> str:
    first, second = (("b", "j", q), ("a", "i", p)) if b_first else (("a", "i", p), ("b", "j", q))
    return f"""def interleave(a, b):
    out, i, j = [], 0, 0
    while i < len(a) or j < len(b):
        out.extend({first[0]}[{first[1]}:{first[1]} + {first[2]}])
        {first[1]} += {first[2]}
        out.extend({second[0]}[{second[1]}:{second[1]} + {second[2]}])
        {second[1]} += {second[2]}
    return out
"""


INTERLEAVE = FunctionTemplate(
    name="list.interleave", entry="interleave",
    signature="interleave(a: list[int], b: list[int]) -> list[int]",
    params=lambda r: {"p": r.randint(1, 5), "q": r.randint(1, 5)},
    describe=lambda p: (f"merges a and b by taking {p['p']} element(s) from a, then {p['q']} from b, "
                        f"and so on; when one list runs out, the rest of the other follows"),
    solution=lambda p: _interleave_solution(p["p"], p["q"]),
    wrong=lambda p: _interleave_solution(p["p"], p["q"], b_first=True),
    case=lambda r, p: [ints(r, 0, 9, 9), ints(r, 10, 19, 9)],
    edge=lambda p: [[[], []], [[1, 2], []]],
)

_RUN_COND = {"equal": "x == xs[i - 1]", "increasing": "x > xs[i - 1]",
             "decreasing": "x < xs[i - 1]", "non-decreasing": "x >= xs[i - 1]"}
_RUN_TEXT = {"equal": "equal to", "increasing": "greater than", "decreasing": "less than",
             "non-decreasing": "greater than or equal to"}


def _runs_solution(kind: str, m: int, off: int = 0) -> str:
    ret = "max(lengths, default=0)" if m == 0 else f"sum(1 for n in lengths if n >= {m + off})"
    return f"""def runs(xs):
    lengths = []
    for i, x in enumerate(xs):
        if i and {_RUN_COND[kind]}:
            lengths[-1] += 1
        else:
            lengths.append(1)
    return {ret}
"""


def _runs_case(r: random.Random, p) -> list[int]:
    """Random values with one planted run (random lists rarely hold long strict runs)."""
    n = r.randint(1, p["m"] + 3)
    start = r.randint(0, 5)
    run = {"equal": [start] * n, "increasing": list(range(start, start + n)),
           "decreasing": list(range(start + n, start, -1)),
           "non-decreasing": sorted(r.randint(0, 4) for _ in range(n))}[p["kind"]]
    xs = ints(r, 0, 4, 10)
    at = r.randint(0, len(xs))
    return xs[:at] + run + xs[at:]


RUNS = FunctionTemplate(
    name="list.runs", entry="runs", signature="runs(xs: list[int]) -> int",
    params=lambda r: {"kind": r.choice(sorted(_RUN_COND)), "m": r.randint(0, 4)},
    describe=lambda p: (f"splits xs into maximal runs of consecutive elements where each element is "
                        f"{_RUN_TEXT[p['kind']]} the one before, and returns "
                        + ("the length of the longest run (0 for an empty list)" if p["m"] == 0 else
                           f"how many runs have at least {p['m'] + 1} elements")),
    solution=lambda p: _runs_solution(p["kind"], p["m"] + 1 if p["m"] else 0),
    wrong=lambda p: (_runs_solution(p["kind"], p["m"] + 1, 1) if p["m"] else
                     _runs_solution({"equal": "non-decreasing", "increasing": "non-decreasing",
                                     "decreasing": "equal", "non-decreasing": "increasing"}[p["kind"]], 0)),
    case=lambda r, p: [_runs_case(r, p)],
    edge=lambda p: [[[]]],
)


def _hist_solution(w: int, keys: str, rounding: bool = False) -> str:
    k = f"round(x / {w})" if rounding else f"x // {w}"
    key = f"k * {w}" if keys == "start" else "k"
    return f"""def histogram(xs):
    out = {{}}
    for x in xs:
        k = {k}
        out[{key}] = out.get({key}, 0) + 1
    return out
"""


HISTOGRAM = FunctionTemplate(
    name="list.histogram", entry="histogram", signature="histogram(xs: list[int]) -> dict[int, int]",
    params=lambda r: {"w": r.randint(2, 12), "keys": r.choice(["start", "index"])},
    describe=lambda p: (f"counts the non-negative integers of xs per bucket of width {p['w']} (bucket k "
                        f"holds {p['w']}*k to {p['w']}*k + {p['w'] - 1}) and returns a dict from each "
                        f"non-empty bucket's {'first value' if p['keys'] == 'start' else 'index k'} "
                        f"to its count"),
    solution=lambda p: _hist_solution(p["w"], p["keys"]),
    wrong=lambda p: _hist_solution(p["w"], p["keys"], rounding=True),
    case=lambda r, p: [ints(r, 0, 4 * p["w"], 12)],
    edge=lambda p: [[[]]],
)

TEMPLATES = (ROTATE, CHUNK, WINDOW, LIMIT, KTH, CLIP, STEPS, BEST, INTERLEAVE, RUNS, HISTOGRAM)
