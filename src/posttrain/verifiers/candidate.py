"""Running candidate code, and what crosses the sandbox boundary: the candidate process
(`CANDIDATE_PROGRAM`), the plain-JSON encoding of its return values (`encode_value` /
`DECODE_SOURCE`), the host-side comparison (`same_value`) and code extraction from an answer.
Shared by the io and check modes of the `unit-tests` verifier (`code.py`, `code_check.py`) and
the geometry family; see `code.py` for the threat model."""

from __future__ import annotations

import inspect
import json
import math
import re
import secrets
from dataclasses import dataclass
from typing import Any

from posttrain.verifiers.base import VerifierError

MAX_CODE_CHARS = 100_000
"""longer candidate code is refused (a failed verdict), before anything runs"""

DEFAULT_TIMEOUT_S = 6.0
"""wall budget of the candidate process (all cases together) unless `timeout_s` is set"""


def encode_value(v, depth=0, tuples=False):  # no annotations: its source is sent into the sandbox
    """A return value as plain JSON for comparison: tuples become lists (`{"tuple": [...]}` with
    `tuples`), dicts `{"dict": [[key, value], ...]}` sorted, sets `{"set": [...]}`, non-finite
    floats `{"float": "nan"|"inf"|"-inf"}`, anything else `{"type": name}` (never equal to an
    expected value). Runs in the candidate process and, for expected values, on the host: only
    these plain values ever leave the candidate's process, so an object with a rigged `__eq__`
    cannot take part in a comparison."""
    if depth > 50:
        raise ValueError("return value nested deeper than 50 levels")
    if v is None or isinstance(v, bool):
        return v
    if isinstance(v, int):
        return int(v)
    if isinstance(v, float):
        if v != v:
            return {"float": "nan"}
        if v in (float("inf"), float("-inf")):
            return {"float": "inf" if v > 0 else "-inf"}
        return float(v)
    if isinstance(v, str):
        return str(v)
    if isinstance(v, tuple) and tuples:
        return {"tuple": [encode_value(x, depth + 1, tuples) for x in v]}
    if isinstance(v, (list, tuple)):
        return [encode_value(x, depth + 1, tuples) for x in v]
    if isinstance(v, dict):
        items = [[encode_value(k, depth + 1, tuples), encode_value(x, depth + 1, tuples)]
                 for k, x in v.items()]
        return {"dict": sorted(items, key=lambda kv: json.dumps(kv[0], sort_keys=True))}
    if isinstance(v, (set, frozenset)):
        return {"set": sorted((encode_value(x, depth + 1, tuples) for x in v),
                              key=lambda x: json.dumps(x, sort_keys=True))}
    return {"type": type(v).__name__}


def same_value(expected: Any, got: Any, rel_tol: float = 1e-6, abs_tol: float = 1e-9) -> bool:
    """Encoded values equal; a float expected value matches any number within tolerance, an
    int expected value only an int (True is not 1)."""
    if isinstance(expected, float):
        return (isinstance(got, (int, float)) and not isinstance(got, bool)
                and math.isclose(expected, got, rel_tol=rel_tol, abs_tol=abs_tol))
    if isinstance(expected, bool) or isinstance(got, bool):
        return type(expected) is type(got) and expected == got
    if isinstance(expected, list):
        return (isinstance(got, list) and len(got) == len(expected)
                and all(same_value(e, g, rel_tol, abs_tol) for e, g in zip(expected, got)))
    if isinstance(expected, dict):
        return (isinstance(got, dict) and expected.keys() == got.keys()
                and all(same_value(expected[k], got[k], rel_tol, abs_tol) for k in expected))
    return type(expected) is type(got) and expected == got


# The inverse of `encode_value(..., tuples=True)`: test arguments in the candidate process,
# candidate results in the check-mode grader. Source text: it runs in sandboxes too.
DECODE_SOURCE = r'''
class Opaque:
    """An object the candidate returned that is not a plain value: equal only to itself."""

    __slots__ = ("type_name",)

    def __init__(self, type_name):
        self.type_name = type_name

    def __repr__(self):
        return f"<{self.type_name} object returned by the candidate>"


def decode_value(v, depth=0):
    if depth > 60:
        raise ValueError("value nested deeper than 60 levels")
    if isinstance(v, list):
        return [decode_value(x, depth + 1) for x in v]
    if not isinstance(v, dict):
        return v
    if "tuple" in v:
        return tuple(decode_value(x, depth + 1) for x in v["tuple"])
    if "dict" in v:
        return {decode_value(k, depth + 1): decode_value(x, depth + 1) for k, x in v["dict"]}
    if "set" in v:
        return {decode_value(x, depth + 1) for x in v["set"]}
    if "float" in v:
        return float(v["float"])
    return Opaque(str(v.get("type", "unknown"))[:100])
'''
exec(DECODE_SOURCE)


_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.S)


def extract_code(answer: str, entry_point: str | None = None) -> str:
    """The code in an answer: a fenced block (the first ```python block that defines
    `entry_point`, else the first python block, else the first block), or the raw text."""
    blocks = [(lang.lower(), body) for lang, body in _FENCE.findall(answer)]
    if not blocks:
        return answer.strip("\n")
    python = [b for lang, b in blocks if lang in ("python", "py", "python3", "")]
    pool = python or [b for _, b in blocks]
    if entry_point:
        for body in pool:
            if re.search(rf"^\s*(async\s+)?def\s+{re.escape(entry_point)}\s*\(", body, re.M):
                return body
    return pool[0]


def defines_function(code: str, name: str) -> bool:
    return re.search(rf"^(async\s+)?def\s+{re.escape(name)}\s*\(", code, re.M) is not None


CASE_MARK = "@@ptcase:"
CANDIDATE_PRELOAD = ("json",)
"""what the candidate harness imports: a code domain's sandbox preloads it (`Domain.preload`),
so that each graded answer does not pay the import (~3 ms of a ~10 ms grade)"""

# The candidate process, run directly in the candidate sandbox (no grader runs there: the host
# judges). Payload (stdin): code, stub, entry_point, cases, decode, mark. It reports JSON lines
# on its original stdout, prefixed with `mark`; everything the candidate prints goes to stderr.
CANDIDATE_PROGRAM = "import os, sys\n" + r'''
_ws = os.path.realpath(os.getcwd())
sys.path[:] = [p for p in sys.path if p not in ("", ".")
               and not (os.path.realpath(p) + "/").startswith(_ws + "/")]
import json
''' + inspect.getsource(encode_value) + "\n" + DECODE_SOURCE + r'''

def _describe(e):
    return f"{type(e).__name__}: {e}"[:500]


def _main():
    p = json.loads(sys.stdin.buffer.read().decode("utf-8"))
    sys.stdin = open(os.devnull)
    mark, rep = p["mark"], os.dup(1)
    os.dup2(2, 1)  # print() of the candidate goes to stderr; only `report` writes to `rep`

    def report(obj):
        os.write(rep, (mark + json.dumps(obj) + "\n").encode())

    report({"ready": True})  # the harness started; what fails after this is the candidate's
    ns = {"__name__": "solution"}
    try:
        if p.get("stub"):
            exec(compile(p["stub"], "stub.py", "exec"), ns)
        exec(compile(p["code"], "solution.py", "exec"), ns)
    except BaseException as e:  # SyntaxError, SystemExit, anything raised at import time
        report({"load_error": _describe(e)})
        return
    fn = ns.get(p["entry_point"])
    if not callable(fn):
        report({"load_error": f"the code defines no function {p['entry_point']!r}"})
        return
    for i, args in enumerate(p["cases"]):
        try:
            if p["decode"]:
                args = decode_value(args)
            out = json.dumps(encode_value(fn(*args), 0, p["decode"]))
        except BaseException as e:
            report({"i": i, "exc": _describe(e), "exc_type": type(e).__name__})
            continue
        if len(out) > 65536:
            report({"i": i, "exc": f"return value too large ({len(out)} characters as JSON)"})
        else:
            os.write(rep, (mark + '{"i": %d, "out": %s}\n' % (i, out)).encode())


_main()
'''


@dataclass
class CandidateRun:
    """What the candidate process reported for a list of cases."""

    results: dict[int, dict]
    """case index -> {"out": encoded value} or {"exc": text, "exc_type": name}"""
    load_error: str | None
    ended: str | None
    """how the process ended when that is a reason to fail (timeout, limit, signal, status)"""
    seconds: float
    output_tail: str


def run_candidate(sandbox: Any, code: str, stub: str, entry: str, cases: list, *, decode: bool,
                  timeout: float, label: str) -> CandidateRun:
    """Run `code` on `cases` in `sandbox` (the episode's: it is never used to judge) and collect
    its reports. A harness that fails before loading the code is a `VerifierError`."""
    from posttrain.sandbox.base import SandboxError

    mark = f"{CASE_MARK}{secrets.token_hex(8)}@@"
    stdin = json.dumps({"code": code, "stub": stub, "entry_point": entry, "cases": cases,
                        "decode": decode, "mark": mark})
    try:
        # the harness is our own program, the same text every time (the candidate's code comes
        # on stdin): the job server compiles it once
        r = sandbox.run_python(CANDIDATE_PROGRAM, stdin=stdin, timeout=timeout, cache=True)
    except SandboxError as e:
        raise VerifierError(f"{label}: the sandbox failed while running the candidate: {e}") from e
    ready, load_error, results = False, None, {}
    for line in r.stdout.splitlines():
        if not line.startswith(mark):
            continue
        try:
            obj = json.loads(line[len(mark):])
        except (ValueError, RecursionError):  # a forged, garbled line counts as no report
            continue
        if not isinstance(obj, dict):
            continue
        if obj.get("ready") is True:
            ready = True
        elif "load_error" in obj and load_error is None:
            load_error = str(obj["load_error"])[:500]
        elif isinstance(obj.get("i"), int) and 0 <= obj["i"] < len(cases) and obj["i"] not in results:
            results[obj["i"]] = obj  # the first report of each case counts
    if not ready:
        raise VerifierError(f"{label}: the candidate harness failed before loading the code "
                            f"(exit {r.exit_code}, limit {r.limit}): {r.stderr[-600:]!r}")
    return CandidateRun(results, load_error, _ending(r, timeout), round(r.wall_s, 3),
                        r.stderr[-600:])


def _ending(r: Any, timeout: float) -> str | None:
    from posttrain.sandbox.base import LimitReason

    if r.limit is LimitReason.TIMEOUT:
        return f"timed out after {timeout:g} s"
    if r.limit is not None:
        return f"killed by the {r.limit.value} limit"
    if r.signal is not None:
        return f"killed by signal {r.signal}"
    if r.exit_code not in (0, None):
        return f"exited with status {r.exit_code}"
    return None
