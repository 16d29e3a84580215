"""Function templates over strings (domains `code.str.*`)."""

from __future__ import annotations

import random
import string

from posttrain.tasks.families.code.template import FunctionTemplate

VOCAB = ("apple", "river", "stone", "cloud", "green", "light", "tiger", "paper", "music", "ocean",
         "bread", "chair", "dance", "eagle", "flame", "grape", "house", "index", "jelly", "knife",
         "lemon", "mango", "night", "olive", "piano", "queen", "robot", "sugar", "table", "unity",
         "cat", "dog", "sun", "sky", "red", "big", "run", "box", "key", "map", "a", "an", "the",
         "of", "and", "or", "in", "on", "to", "for", "with", "at", "strawberry", "mountain",
         "telescope", "butterfly", "adventure", "chocolate", "elephant", "umbrella", "tree",
         "snow", "garden", "basket", "kitchen", "picture", "imagination", "extravagant")
SMALL_WORDS = ("a", "an", "the", "of", "and", "or", "in", "on", "to", "for", "with", "at")


def words(rng: random.Random, n_max: int = 10, n_min: int = 0, case: bool = False) -> list[str]:
    out = [rng.choice(VOCAB) for _ in range(rng.randint(n_min, n_max))]
    if case:
        out = [rng.choice([w, w.upper(), w.capitalize()]) for w in out]
    return out


def sentence(rng: random.Random, n_max: int = 10, n_min: int = 0, case: bool = False) -> str:
    return " ".join(words(rng, n_max, n_min, case))


def mixed(rng: random.Random, n_max: int = 24) -> str:
    pool = string.ascii_letters + string.digits + "    \t.,!?;:-'()"
    return "".join(rng.choice(pool) for _ in range(rng.randint(0, n_max)))


def _shift_solution(sh: int, upper: bool = True) -> str:
    up = (f"        elif 'A' <= c <= 'Z':\n"
          f"            out.append(chr((ord(c) - 65 + ({sh})) % 26 + 65))\n") if upper else ""
    return f"""def shift(s):
    out = []
    for c in s:
        if 'a' <= c <= 'z':
            out.append(chr((ord(c) - 97 + ({sh})) % 26 + 97))
{up}        else:
            out.append(c)
    return ''.join(out)
"""


CAESAR = FunctionTemplate(
    name="str.caesar", entry="shift", signature="shift(s: str) -> str",
    params=lambda r: {"k": r.randint(1, 25), "dir": r.choice(["forward", "backward"])},
    describe=lambda p: (f"moves every ASCII letter of s {p['k']} places {p['dir']} in the alphabet, "
                        f"wrapping around (z to a) and keeping its case; other characters stay"),
    solution=lambda p: _shift_solution(p["k"] if p["dir"] == "forward" else -p["k"]),
    wrong=lambda p: _shift_solution(p["k"] if p["dir"] == "forward" else -p["k"], upper=False),
    case=lambda r, p: [mixed(r)],
    edge=lambda p: [[""], ["Zz Aa!"]],
    bug=lambda p: ("% 26 + 65", "% 26 + 97"),  # uppercase letters come out lowercase
    split_by=('k',),
)

_CLASSES = {
    "vowels": ("a vowel (a, e, i, o, u, in either case)", "c.lower() in 'aeiou'", "c in 'aeiou'"),
    "consonants": ("an ASCII letter that is not a vowel (a, e, i, o, u, in either case)",
                   "c.isascii() and c.isalpha() and c.lower() not in 'aeiou'",
                   "c.isalpha() and c not in 'aeiou'"),
    "digits": ("an ASCII digit", "c in '0123456789'", "c in '123456789'"),
    "upper": ("an uppercase ASCII letter", "'A' <= c <= 'Z'", "c == c.upper()"),
    "lower": ("a lowercase ASCII letter", "'a' <= c <= 'z'", "c == c.lower()"),
    "spaces": ("a space (' ', not other whitespace)", "c == ' '", "c.isspace()"),
    "punctuation": (f"one of {string.punctuation!r}", f"c in {string.punctuation!r}", "not c.isalnum()"),
}


def _class(p) -> tuple[str, str, str]:
    c = p["cls"]
    if c in _CLASSES:
        return _CLASSES[c]
    return (f"the letter '{c}' in either case", f"c.lower() == '{c}'", f"c == '{c}'")


COUNT = FunctionTemplate(
    name="str.count", entry="count", signature="count(s: str) -> int",
    params=lambda r: {"cls": r.choice(sorted(_CLASSES) + list(string.ascii_lowercase))},
    describe=lambda p: f"returns how many characters of s are {_class(p)[0]}",
    solution=lambda p: f"def count(s):\n    return sum(1 for c in s if {_class(p)[1]})\n",
    wrong=lambda p: f"def count(s):\n    return sum(1 for c in s if {_class(p)[2]})\n",
    case=lambda r, p: [mixed(r, 30) + (p["cls"].upper() if len(p["cls"]) == 1 else "")],
    edge=lambda p: [[""]],
)


def _rle_solution(fmt: str, m: int, cmp: str = ">=") -> str:
    piece = "s[i] + str(n)" if fmt == "char-count" else "str(n) + s[i]"
    return f"""def rle(s):
    out, i = [], 0
    while i < len(s):
        j = i
        while j < len(s) and s[j] == s[i]:
            j += 1
        n = j - i
        out.append({piece} if n {cmp} {m} else s[i:j])
        i = j
    return ''.join(out)
"""


RLE = FunctionTemplate(
    name="str.rle", entry="rle", signature="rle(s: str) -> str",
    params=lambda r: {"fmt": r.choice(["char-count", "count-char"]), "m": r.randint(1, 10)},
    describe=lambda p: (f"run-length encodes s: every maximal run of one repeated character that is at "
                        f"least {p['m']} long becomes "
                        + ("the character followed by the run length" if p["fmt"] == "char-count"
                           else "the run length followed by the character")
                        + " (e.g. 'aaa' -> " + ("'a3'" if p["fmt"] == "char-count" else "'3a'")
                        + "); shorter runs are copied unchanged"),
    solution=lambda p: _rle_solution(p["fmt"], p["m"]),
    wrong=lambda p: _rle_solution(p["fmt"], p["m"], ">"),
    case=lambda r, p: ["".join(r.choice("abc") * r.randint(1, p["m"] + 2) for _ in range(r.randint(0, 6)))],
    edge=lambda p: [[""], ["x" * p["m"]]],
    bug=lambda p: (f"if n >= {p['m']}", f"if n > {p['m']}"),
    split_by=('m',),
)


def _freq_solution(lo: int, hi: int, lower: bool = True) -> str:
    src = "s.lower().split()" if lower else "s.split()"
    return f"""def freq(s):
    out = {{}}
    for w in {src}:
        if {lo} <= len(w) <= {hi}:
            out[w] = out.get(w, 0) + 1
    return out
"""


FREQ = FunctionTemplate(
    name="str.freq", entry="freq", signature="freq(s: str) -> dict[str, int]",
    params=lambda r: (lambda lo: {"lo": lo, "hi": lo + r.randint(0, 4)})(r.randint(1, 5)),
    describe=lambda p: (f"splits s on whitespace, lowercases the words and returns a dict from every word "
                        f"of {p['lo']} to {p['hi']} characters (inclusive) to how often it occurs"),
    solution=lambda p: _freq_solution(p["lo"], p["hi"]),
    wrong=lambda p: _freq_solution(p["lo"], p["hi"], lower=False),
    case=lambda r, p: [sentence(r, 12, case=True)],
    edge=lambda p: [[""]],
)


def _title_solution(small: list[str], first_exempt: bool = True) -> str:
    cond = "i > 0 and w in small" if first_exempt else "w in small"
    return f"""def title(s):
    small = {tuple(small)!r}
    out = []
    for i, w in enumerate(s.split(' ')):
        w = w.lower()
        out.append(w if {cond} else w[:1].upper() + w[1:])
    return ' '.join(out)
"""


TITLE = FunctionTemplate(
    name="str.title", entry="title", signature="title(s: str) -> str",
    params=lambda r: {"small": sorted(r.sample(SMALL_WORDS, r.randint(2, 4)))},
    describe=lambda p: (f"lowercases every word of s (words are separated by single spaces) and "
                        f"capitalizes its first letter, except that the words "
                        f"{', '.join(repr(w) for w in p['small'])} stay all lowercase unless they "
                        f"are the first word"),
    solution=lambda p: _title_solution(p["small"]),
    wrong=lambda p: _title_solution(p["small"], first_exempt=False),
    case=lambda r, p: [" ".join([r.choice(p["small"])] * r.randint(0, 1) + words(r, 8, 1, case=True))],
    edge=lambda p: [[""]],
)


def _reverse_solution(n: int, order: str, cmp: str = ">=") -> str:
    rev = "    out.reverse()\n" if order == "reverse" else ""
    return f"""def reverse_words(s):
    out = [w[::-1] if len(w) {cmp} {n} else w for w in s.split(' ')]
{rev}    return ' '.join(out)
"""


REVERSE = FunctionTemplate(
    name="str.reverse", entry="reverse_words", signature="reverse_words(s: str) -> str",
    params=lambda r: {"n": r.randint(2, 11), "order": r.choice(["keep", "reverse"])},
    describe=lambda p: (f"reverses the letters of every word of s that has at least {p['n']} characters "
                        f"(words are separated by single spaces)"
                        + (", and also reverses the order of the words" if p["order"] == "reverse" else
                           ", keeping the words in their order")),
    solution=lambda p: _reverse_solution(p["n"], p["order"]),
    wrong=lambda p: _reverse_solution(p["n"], p["order"], ">"),
    case=lambda r, p: [sentence(r, 8)],
    edge=lambda p: [[""]],
)


def _wrap_solution(width: int, space: int = 1) -> str:
    return f"""def wrap(s):
    lines, cur = [], ''
    for w in s.split():
        if not cur:
            cur = w
        elif len(cur) + {space} + len(w) <= {width}:
            cur += ' ' + w
        else:
            lines.append(cur)
            cur = w
    if cur:
        lines.append(cur)
    return lines
"""


WRAP = FunctionTemplate(
    name="str.wrap", entry="wrap", signature="wrap(s: str) -> list[str]",
    params=lambda r: {"width": r.randint(8, 30)},
    describe=lambda p: (f"wraps s into lines of at most {p['width']} characters: the words (separated by "
                        f"whitespace) are added greedily to the current line with one space between "
                        f"them; a word longer than {p['width']} gets a line of its own. Returns the "
                        f"list of lines ([] when s has no words)"),
    solution=lambda p: _wrap_solution(p["width"]),
    wrong=lambda p: _wrap_solution(p["width"], 0),
    case=lambda r, p: [sentence(r, 14)],
    edge=lambda p: [[""], ["   "]],
    bug=lambda p: ("len(cur) + 1 + len(w)", "len(cur) + len(w)"),
)


def _mask_solution(k: int, side: str, ch: str) -> str:
    body = f"'{ch}' * (len(s) - {k}) + s[-{k}:]" if side == "last" else f"s[:{k}] + '{ch}' * (len(s) - {k})"
    return f"def mask(s):\n    if len(s) <= {k}:\n        return s\n    return {body}\n"


MASK = FunctionTemplate(
    name="str.mask", entry="mask", signature="mask(s: str) -> str",
    params=lambda r: {"k": r.randint(1, 6), "side": r.choice(["first", "last"]), "ch": r.choice("#*")},
    describe=lambda p: (f"replaces every character of s with '{p['ch']}' except the {p['side']} {p['k']}; "
                        f"a string of at most {p['k']} characters is returned unchanged"),
    solution=lambda p: _mask_solution(p["k"], p["side"], p["ch"]),
    wrong=lambda p: _mask_solution(p["k"], "first" if p["side"] == "last" else "last", p["ch"]),
    case=lambda r, p: ["".join(r.choice(string.digits + "abc") for _ in range(r.randint(0, 14)))],
    edge=lambda p: [[""]],
    split_by=('k', 'ch'),
)


def _translate_params(r: random.Random) -> dict:
    a, b, c, x, y = r.sample(string.ascii_lowercase, 5)
    return {"src": [a, b, c], "dst": [b, x, y]}  # a->b and b->x: a chain, so order matters


def _translate_solution(src: list[str], dst: list[str], sequential: bool = False) -> str:
    if sequential:
        return (f"def translate(s):\n    for a, b in zip({src!r}, {dst!r}):\n"
                f"        s = s.replace(a, b)\n    return s\n")
    return (f"def translate(s):\n    table = dict(zip({src!r}, {dst!r}))\n"
            f"    return ''.join(table.get(c, c) for c in s)\n")


TRANSLATE = FunctionTemplate(
    name="str.translate", entry="translate", signature="translate(s: str) -> str",
    params=_translate_params,
    describe=lambda p: ("replaces, all at once (a replaced character is not replaced again), "
                        + ", ".join(f"every '{a}' with '{b}'" for a, b in zip(p["src"], p["dst"]))
                        + "; other characters stay"),
    solution=lambda p: _translate_solution(p["src"], p["dst"]),
    wrong=lambda p: _translate_solution(p["src"], p["dst"], sequential=True),
    case=lambda r, p: ["".join(r.choice(p["src"] + p["dst"] + ["z", " "]) for _ in range(r.randint(0, 16)))],
    edge=lambda p: [[""], ["".join(p["src"])]],
)

TEMPLATES = (CAESAR, COUNT, RLE, FREQ, TITLE, REVERSE, WRAP, MASK, TRANSLATE)
