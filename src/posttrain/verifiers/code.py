"""The `unit-tests` verifier: run candidate Python code against hidden tests in the sandbox.

Two processes take part, both started with `python3 -I` (see `script.py` for the protections):

* the **grader** (ours) reads the hidden inputs from stdin, starts the candidate process, enforces
  its time budget, and prints one nonce-marked result line;
* the **candidate process** loads the candidate code, runs the tests and reports through a file
  descriptor. Its stdout/stderr go to a capped file (only a tail is kept in the verdict).

Two test modes (`task.verifier["mode"]`):

* `io` — the candidate process calls `entry_point(*args)` for each hidden case and reports the
  return values, encoded as plain JSON (lists and tuples alike, dicts with typed keys, sets
  sorted). The **expected values never enter the sandbox**: the host compares. A candidate can
  only "forge" a report by printing the right outputs, which is solving the task. This is what
  the generated code domains use.
* `check` — HumanEval style: a `check(candidate)` test function runs in the candidate's namespace
  and the candidate process reports a per-grading random token when it returns. Code running in
  that process can subvert its own tests (e.g. find the token by inspecting frames, or return an
  object whose `__eq__` is always true): this mode stops the cheap forgeries (printing a pass
  line, exiting early with status 0, writing result files), not a deliberate adversary.

A candidate that raises, hangs, exits early (`os._exit(0)`), floods its output or is killed by a
limit fails with the reason in `details`; a grader that cannot report is a `VerifierError`.
"""

from __future__ import annotations

import inspect
import json
import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from posttrain.values.verdict import Verdict
from posttrain.verifiers.base import Outcome, VerifierError, verdict
from posttrain.verifiers.script import GRADER_MARGIN_S, grading_sandbox, run_grader

if TYPE_CHECKING:
    from posttrain.sandbox.base import Sandbox
    from posttrain.values.task import Task

MAX_CODE_CHARS = 100_000
"""longer candidate code is refused (a failed verdict), before anything runs"""

DEFAULT_TIMEOUT_S = 6.0
"""wall budget of the candidate process (all cases together) unless `timeout_s` is set"""


def encode_value(v, depth=0):  # no annotations: its source is sent into the sandbox
    """A return value as plain JSON for comparison: tuples become lists, dicts become
    `{"dict": [[key, value], ...]}` sorted, sets `{"set": [...]}`, non-finite floats
    `{"float": "nan"|"inf"|"-inf"}`, anything else `{"type": name}` (never equal to an expected
    value). Runs in the candidate process and, for expected values, on the host."""
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
    if isinstance(v, (list, tuple)):
        return [encode_value(x, depth + 1) for x in v]
    if isinstance(v, dict):
        items = [[encode_value(k, depth + 1), encode_value(x, depth + 1)] for k, x in v.items()]
        return {"dict": sorted(items, key=lambda kv: json.dumps(kv[0], sort_keys=True))}
    if isinstance(v, (set, frozenset)):
        return {"set": sorted((encode_value(x, depth + 1) for x in v),
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


# The candidate process. Its payload (stdin): code, mode, entry_point, cases | test, token,
# report_fd. It reports JSON lines on report_fd; everything else it prints goes to a file.
CANDIDATE_PROGRAM = "import json, os, sys\n" + inspect.getsource(encode_value) + r'''

def _describe(e):
    return f"{type(e).__name__}: {e}"[:500]


def _main():
    p = json.loads(sys.stdin.read())
    sys.stdin = open(os.devnull)
    fd, token = p["report_fd"], p.pop("token")

    def report(obj):
        os.write(fd, (json.dumps(obj) + "\n").encode())

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
    if p["mode"] == "io":
        for i, args in enumerate(p["cases"]):
            try:
                out = json.dumps(encode_value(fn(*args)))
            except BaseException as e:
                report({"i": i, "exc": _describe(e)})
                continue
            if len(out) > 65536:
                report({"i": i, "exc": f"return value too large ({len(out)} characters as JSON)"})
            else:
                os.write(fd, ('{"i": %d, "out": %s}\n' % (i, out)).encode())
    else:
        try:
            exec(compile(p["test"], "tests.py", "exec"), ns)
            ns["check"](fn)
        except BaseException as e:
            report({"exc": _describe(e)})
            return
        report({"ok": token})


_main()
'''

# The grader: runs the candidate process under a wall budget, returns what it reported.
GRADER_PROGRAM = r'''
import signal, subprocess, tempfile, time

p = _PAYLOAD
tmp = tempfile.mkdtemp(prefix="ptcode-")
out = tempfile.TemporaryFile(dir=tmp)
rep = tempfile.TemporaryFile(dir=tmp)
token = os.urandom(16).hex()
child_in = json.dumps({"code": p["code"], "stub": p.get("stub") or "", "mode": p["mode"],
                       "entry_point": p["entry_point"], "cases": p.get("cases") or [],
                       "test": p.get("test") or "", "token": token, "report_fd": rep.fileno()})
t0 = time.monotonic()
proc = subprocess.Popen([sys.executable, "-I", "-c", p["program"]], stdin=subprocess.PIPE,
                        stdout=out, stderr=subprocess.STDOUT, pass_fds=(rep.fileno(),),
                        start_new_session=True)
status = "exited"
try:
    proc.communicate(child_in.encode(), timeout=p["timeout_s"])
except subprocess.TimeoutExpired:
    status = "timeout"
except BrokenPipeError:
    proc.wait()
try:
    os.killpg(proc.pid, signal.SIGKILL)  # the candidate's leftovers (it is gone or timed out)
except OSError:
    pass
proc.wait()
rep.seek(0)
lines, ok, ready = [], False, False
for raw in rep.read(8 << 20).splitlines()[:10000]:
    try:
        obj = json.loads(raw)
    except ValueError:
        continue
    if isinstance(obj, dict):
        if "ok" in obj:
            ok = ok or obj["ok"] == token
        elif "ready" in obj:
            ready = True
        else:
            lines.append(obj)
out.seek(0, 2)
size = out.tell()
out.seek(max(0, size - 1500))
tail = out.read().decode("utf-8", "replace")
out.close()
rep.close()
import shutil
shutil.rmtree(tmp, ignore_errors=True)  # a process-backend sandbox's /tmp is the host's
emit({"status": status, "returncode": proc.returncode, "seconds": round(time.monotonic() - t0, 3),
      "report": lines, "check_ok": ok, "ready": ready, "output_tail": tail})
'''


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
    version: str = "1"
    needs_sandbox: bool = True

    def verify(self, task: Task, outcome: Outcome) -> Verdict:
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
        with grading_sandbox(outcome) as sandbox:
            code = self._candidate_code(task, outcome, sandbox, entry)
            if isinstance(code, Verdict):
                return code
            if stub and not _defines(code, entry):
                code, stub = stub + code, ""
            payload = {"program": CANDIDATE_PROGRAM, "code": code, "stub": stub, "mode": mode,
                       "entry_point": entry, "cases": s.get("cases"), "test": s.get("test"),
                       "timeout_s": timeout}
            found = run_grader(sandbox, GRADER_PROGRAM, payload, timeout=timeout + GRADER_MARGIN_S,
                               label=f"unit-tests verifier, task {task.key}")
        return self._judge(task, found, timeout)

    def _candidate_code(self, task: Task, outcome: Outcome, sandbox: Sandbox, entry: str) -> str | Verdict:
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

    def _judge(self, task: Task, found: dict[str, Any], timeout: float) -> Verdict:
        s = task.verifier
        common: dict[str, Any] = {"seconds": found.get("seconds"),
                                  "output_tail": str(found.get("output_tail", ""))[-600:]}
        if not found.get("ready"):
            raise VerifierError(f"task {task.key}: the candidate harness failed before loading the "
                                f"code: {str(found.get('output_tail', ''))[-600:]!r}")
        report = [r for r in found.get("report", []) if isinstance(r, dict)]
        load = next((r["load_error"] for r in report if "load_error" in r), None)
        if load is not None:
            return verdict(self, False, reason="code failed to load", error=str(load)[:500], **common)
        ended = self._ending(found, timeout)
        if s.get("mode", "io") == "check":
            if found.get("check_ok") is True:
                return verdict(self, True, **common)
            exc = next((r["exc"] for r in report if "exc" in r), None)
            return verdict(self, False, reason="tests failed" if exc else ended or "tests did not finish",
                           error=str(exc)[:500] if exc else None, **common)
        expected = s["expected"]
        results: dict[int, dict] = {}
        for r in report:  # the first report of each case counts
            i = r.get("i")
            if isinstance(i, int) and 0 <= i < len(expected) and i not in results:
                results[i] = r
        rel_tol = float(s.get("rel_tol", 1e-6))
        passed_cases, failure = 0, None
        for i, want in enumerate(expected):
            res = results.get(i)
            if res is not None and "out" in res and same_value(want, res["out"], rel_tol):
                passed_cases += 1
            elif failure is None:
                failure = {"case": i, "args": json.dumps(s["cases"][i])[:300],
                           "expected": json.dumps(want)[:300]}
                if res is None:
                    failure["got"] = f"no result ({ended or 'the candidate stopped before this case'})"
                elif "exc" in res:
                    failure["raised"] = str(res["exc"])[:300]
                else:
                    failure["got"] = json.dumps(res.get("out"))[:300]
        passed = passed_cases == len(expected)
        return verdict(self, passed, cases=len(expected), cases_passed=passed_cases,
                       reason=None if passed else "wrong result", first_failure=failure, **common)

    @staticmethod
    def _ending(found: dict[str, Any], timeout: float) -> str | None:
        """How the candidate process ended, when that is a reason to fail."""
        if found.get("status") == "timeout":
            return f"timed out after {timeout:g} s"
        code = found.get("returncode")
        if isinstance(code, int) and code < 0:
            return f"killed by signal {-code}"
        if code not in (0, None):
            return f"exited with status {code}"
        return None


UNIT_TESTS = UnitTestVerifier()
