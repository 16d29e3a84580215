"""Function templates over dicts (domains `code.dict.*`)."""

from __future__ import annotations

import random

from posttrain.tasks.families.code.strings import words
from posttrain.tasks.families.code.template import FunctionTemplate

_KEYS = {"length": ("length", "len(w)"), "first": ("first letter", "w[0]"),
         "last": ("last letter", "w[-1]"),
         "vowels": ("number of vowels", "sum(1 for c in w if c in 'aeiou')")}


def _group_solution(key: str, g: int, distinct: bool = True) -> str:
    return f"""def group(words):
    groups = {{}}
    for w in {'set(words)' if distinct else 'words'}:
        groups.setdefault({_KEYS[key][1]}, []).append(w)
    return dict((k, sorted(v)) for k, v in sorted(groups.items()) if len(v) >= {g})
"""


GROUP = FunctionTemplate(
    name="dict.group", entry="group", signature="group(words: list[str]) -> dict",
    params=lambda r: {"key": r.choice(sorted(_KEYS)), "g": r.randint(1, 5)},
    describe=lambda p: (f"groups the distinct words (non-empty, lowercase) by their {_KEYS[p['key']][0]} "
                        f"and returns a dict from each {_KEYS[p['key']][0]} to the sorted list of "
                        f"distinct words with it, keeping only groups of at least {p['g']} words"),
    solution=lambda p: _group_solution(p["key"], p["g"]),
    wrong=lambda p: _group_solution(p["key"], p["g"], distinct=False),
    case=lambda r, p: [(lambda ws: ws + ws[: r.randint(0, len(ws))])(words(r, 12))],
    edge=lambda p: [[[]]],
)

_MERGE = {"sum": ("the sum of both values", "out[k] + v"), "max": ("the larger value", "max(out[k], v)"),
          "min": ("the smaller value", "min(out[k], v)"), "first": ("the value from a", "out[k]"),
          "second": ("the value from b", "v")}


def _merge_solution(rule: str, t: int, cmp: str = ">") -> str:
    return f"""def merge(a, b):
    out = dict(a)
    for k, v in b.items():
        out[k] = {_MERGE[rule][1]} if k in out else v
    return dict((k, v) for k, v in out.items() if v {cmp} {t})
"""


def _small_dict(r: random.Random) -> dict[str, int]:
    return {k: r.randint(-3, 9) for k in r.sample("abcdefgh", r.randint(0, 6))}


MERGE = FunctionTemplate(
    name="dict.merge", entry="merge", signature="merge(a: dict[str, int], b: dict[str, int]) -> dict[str, int]",
    params=lambda r: {"rule": r.choice(sorted(_MERGE)), "t": r.randint(0, 3)},
    describe=lambda p: (f"merges two dicts: a key in only one of them keeps its value, a key in both gets "
                        f"{_MERGE[p['rule']][0]}; then every key whose merged value is at most {p['t']} "
                        f"is removed"),
    solution=lambda p: _merge_solution(p["rule"], p["t"]),
    wrong=lambda p: _merge_solution(p["rule"], p["t"], ">="),
    case=lambda r, p: [_small_dict(r), _small_dict(r)],
    edge=lambda p: [[{}, {}], [{"a": p["t"]}, {}]],
    bug=lambda p: (f"if v > {p['t']}", f"if v >= {p['t']}"),
)


def _top_solution(k: int, which: str, ties: bool = True) -> str:
    if not ties:
        return (f"def top(d):\n    return sorted(d, key=lambda x: d[x], "
                f"reverse={which == 'largest'})[:{k}]\n")
    sign = "-" if which == "largest" else ""
    return f"def top(d):\n    return [x for x, _ in sorted(d.items(), key=lambda kv: ({sign}kv[1], kv[0]))][:{k}]\n"


TOP = FunctionTemplate(
    name="dict.top", entry="top", signature="top(d: dict[str, int]) -> list[str]",
    params=lambda r: {"k": r.randint(1, 10), "which": r.choice(["largest", "smallest"])},
    describe=lambda p: (f"returns the keys of the {p['k']} {p['which']} values of d, "
                        f"{'largest' if p['which'] == 'largest' else 'smallest'} first, ties broken by "
                        f"key in alphabetical order (all keys when d has fewer than {p['k']})"),
    solution=lambda p: _top_solution(p["k"], p["which"]),
    wrong=lambda p: _top_solution(p["k"], p["which"], ties=False),
    case=lambda r, p: [{k: r.randint(0, 4) for k in r.sample("abcdefghijklmn", r.randint(0, 12))}],
    edge=lambda p: [[{}]],
)

_INVERT = {"sorted": ("the sorted list of the keys with that value", "sorted(ks)"),
           "smallest": ("the alphabetically first key with that value", "min(ks)"),
           "largest": ("the alphabetically last key with that value", "max(ks)"),
           "count": ("the number of keys with that value", "len(ks)")}


def _invert_solution(mode: str, t: int, cmp: str = ">=") -> str:
    return f"""def invert(d):
    groups = {{}}
    for k, v in d.items():
        if v {cmp} {t}:
            groups.setdefault(v, []).append(k)
    return dict((v, {_INVERT[mode][1]}) for v, ks in groups.items())
"""


INVERT = FunctionTemplate(
    name="dict.invert", entry="invert", signature="invert(d: dict[str, int]) -> dict",
    params=lambda r: {"mode": r.choice(sorted(_INVERT)), "t": r.randint(0, 4)},
    describe=lambda p: (f"returns a dict from every value v of d with v >= {p['t']} to "
                        f"{_INVERT[p['mode']][0]}"),
    solution=lambda p: _invert_solution(p["mode"], p["t"]),
    wrong=lambda p: _invert_solution(p["mode"], p["t"], ">"),
    case=lambda r, p: [{k: r.randint(0, 6) for k in r.sample("abcdefghij", r.randint(0, 9))}],
    edge=lambda p: [[{}], [{"x": p["t"]}]],
)

TEMPLATES = (GROUP, MERGE, TOP, INVERT)
