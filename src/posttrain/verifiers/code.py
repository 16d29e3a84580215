"""The `unit-tests` verifier: run candidate Python code against hidden tests.

No grader runs where the candidate runs. The candidate process (`CANDIDATE_PROGRAM`, a job of
the episode's sandbox, `sys.path` as with `python3 -I`) loads the code, calls `entry_point` on
each case and reports the return values as plain JSON (`encode_value`: lists, typed dict keys,
sorted sets, tagged non-finite floats, `{"type": name}` for any other object). The **judge is
the host** (io mode) or a fresh grading sandbox that never runs candidate code (check mode):
an object whose `__eq__` is always true, a walk up the frames, a patched builtin or an early
`os._exit(0)` only changes what the candidate's own process reports, and what it reports is
compared as plain values.

* `io` — the candidate process is given the hidden cases; the expected values never enter any
  sandbox and are compared on the host (`same_value`: an int is not a float is not a bool).
* `check` — HumanEval style, `check(candidate)` (see `code_check.py`): the tests run in a fresh
  grading sandbox against a proxy; every call the tests make is answered with the candidate's
  serialised return value for those arguments, computed beforehand in the candidate's sandbox.

A candidate that raises, hangs, exits early, floods its output or is killed by a limit fails
with the reason in `details`; a harness that fails before loading the code is a `VerifierError`.
"""

from __future__ import annotations

import inspect
import json
import math
import re
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from posttrain.values.verdict import Verdict
from posttrain.verifiers.base import GradingFailed, Outcome, VerifierError, failed_grading, verdict
from posttrain.verifiers.grading import candidate_sandbox

if TYPE_CHECKING:
    from posttrain.values.task import Task

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


def _defines(code: str, name: str) -> bool:
    return re.search(rf"^(async\s+)?def\s+{re.escape(name)}\s*\(", code, re.M) is not None


CASE_MARK = "@@ptcase:"

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
        r = sandbox.run_python(CANDIDATE_PROGRAM, stdin=stdin, timeout=timeout)
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


@dataclass(frozen=True)
class UnitTestVerifier:
    """Checks Python code with hidden unit tests in the sandbox (see the module docstring).

    `task.verifier` settings:

    * `mode`: `"io"` (default) or `"check"`;
    * `entry_point` (str, required): the function under test;
    * `cases` (io): list of argument lists; `expected` (io): the encoded return values
      (`encode_value`), compared on the host only;
    * `test` (check): source defining `check(candidate)`;
    * `stub` (optional): source run before the candidate code (e.g. HumanEval's prompt, with the
      helpers the tests use). When the candidate code does not define `entry_point` it is taken
      as a completion of the stub (appended to it);
    * `file` (optional): grade this workspace file instead of the answer (repair tasks);
    * `timeout_s` (default 6): wall budget of the candidate process, all cases together;
    * `rel_tol` (default 1e-6): relative tolerance for float return values.
    """

    name: str = "unit-tests"
    version: str = "2"
    needs_sandbox: bool = True

    def verify(self, task: "Task", outcome: Outcome) -> Verdict:
        s = task.verifier
        mode = s.get("mode", "io")
        entry = s.get("entry_point")
        if mode not in ("io", "check") or not isinstance(entry, str) or not entry:
            raise VerifierError(f"task {task.key}: verifier needs mode 'io'|'check' and an "
                                f"entry_point (got mode={mode!r}, entry_point={entry!r})")
        if mode == "io" and (not isinstance(s.get("cases"), list)
                             or not isinstance(s.get("expected"), list)
                             or len(s["cases"]) != len(s["expected"]) or not s["cases"]):
            raise VerifierError(f"task {task.key}: io mode needs equally long, non-empty "
                                f"'cases' and 'expected' lists")
        if mode == "check" and not isinstance(s.get("test"), str):
            raise VerifierError(f"task {task.key}: check mode needs a 'test' source string")
        stub = s.get("stub") or ""
        timeout = float(s.get("timeout_s", DEFAULT_TIMEOUT_S))
        label = f"unit-tests verifier, task {task.key}"
        with candidate_sandbox(outcome) as sandbox:
            code = self._candidate_code(task, outcome, sandbox, entry)
            if isinstance(code, Verdict):
                return code
            if stub and not _defines(code, entry):
                code, stub = stub + code, ""
            if mode == "check":
                from posttrain.verifiers.code_check import grade_check_mode

                try:
                    return grade_check_mode(self, task, outcome, sandbox, code, stub, timeout, label)
                except GradingFailed as e:
                    return failed_grading(self, e)
            run = run_candidate(sandbox, code, stub, entry, s["cases"], decode=False,
                                timeout=timeout, label=label)
        return self._judge(task, run)

    def _candidate_code(self, task: "Task", outcome: Outcome, sandbox: Any, entry: str) -> str | Verdict:
        path = task.verifier.get("file")
        if path:
            from posttrain.sandbox.base import WorkspacePathError
            try:
                data = sandbox.read_file(path)
            except (FileNotFoundError, IsADirectoryError, WorkspacePathError, PermissionError) as e:
                return verdict(self, False, reason=f"cannot read {path}: {type(e).__name__}")
            if len(data) > MAX_CODE_CHARS:
                return verdict(self, False, reason=f"{path} is larger than {MAX_CODE_CHARS} bytes")
            code = data.decode("utf-8", errors="replace")
        else:
            code = extract_code(outcome.answer or "", entry)
        if not code.strip():
            return verdict(self, False, reason="no code")
        if len(code) > MAX_CODE_CHARS:
            return verdict(self, False, reason=f"code longer than {MAX_CODE_CHARS} characters")
        return code

    def _judge(self, task: "Task", run: CandidateRun) -> Verdict:
        s = task.verifier
        common = {"seconds": run.seconds, "output_tail": run.output_tail}
        if run.load_error is not None:
            return verdict(self, False, reason="code failed to load", error=run.load_error, **common)
        expected = s["expected"]
        rel_tol = float(s.get("rel_tol", 1e-6))
        passed_cases, failure = 0, None
        for i, want in enumerate(expected):
            r = run.results.get(i)
            if r is not None and "out" in r and same_value(want, r["out"], rel_tol):
                passed_cases += 1
            elif failure is None:
                failure = {"case": i, "args": json.dumps(s["cases"][i])[:300],
                           "expected": json.dumps(want)[:300]}
                if r is None:
                    failure["got"] = f"no result ({run.ended or 'the candidate stopped before this case'})"
                elif "exc" in r:
                    failure["raised"] = str(r["exc"])[:300]
                else:
                    failure["got"] = _short(r.get("out"))
        passed = passed_cases == len(expected)
        return verdict(self, passed, cases=len(expected), cases_passed=passed_cases,
                       reason=None if passed else "wrong result", first_failure=failure, **common)


def _short(v: Any) -> str:
    try:
        return json.dumps(v)[:300]
    except (ValueError, RecursionError):
        return "<unprintable>"


UNIT_TESTS = UnitTestVerifier()
