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

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from posttrain.values.verdict import Verdict
from posttrain.verifiers.base import GradingFailed, Outcome, VerifierError, failed_grading, verdict
from posttrain.verifiers.candidate import (
    DEFAULT_TIMEOUT_S,
    MAX_CODE_CHARS,
    CandidateRun,
    defines_function,
    extract_code,
    run_candidate,
    same_value,
)
from posttrain.verifiers.grading import candidate_sandbox

if TYPE_CHECKING:
    from posttrain.values.task import Task

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
        label = f"unit-tests verifier, task {task.key}"
        with candidate_sandbox(outcome) as sandbox:
            code = self._candidate_code(task, outcome, sandbox, entry)
            if isinstance(code, Verdict):
                return code
            if stub and not defines_function(code, entry):
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

    def _candidate_code(self, task: Task, outcome: Outcome, sandbox: Any, entry: str) -> str | Verdict:
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

    def _judge(self, task: Task, run: CandidateRun) -> Verdict:
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
