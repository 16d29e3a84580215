"""Check mode of the `unit-tests` verifier: HumanEval-style `check(candidate)` tests, judged
outside the candidate's process.

The tests are trusted (they come with the task); the candidate is not. So they never share a
process, a sandbox or a uid:

1. In a **grading sandbox** (`grading.grading_sandbox`: no candidate code ever runs in it), the
   tests call `check(proxy)`. The proxy answers each call from the candidate's recorded results;
   a call with arguments it has no result for is recorded and, to keep discovering the calls of
   the whole test, answered by the task's reference solution when there is one (such a run
   never counts as a verdict).
2. In the **candidate's sandbox**, the candidate process computes its return values for the
   newly recorded arguments and reports them as plain JSON (`encode_value` with tuples kept).
3. Back to 1 with those results, until a run of the tests needs no unknown call (its outcome is
   the verdict) or `MAX_ROUNDS` is reached (a failure: the tests kept asking for new arguments).

`random` is seeded identically before every run, so tests that draw random inputs ask for the
same arguments each time. What the tests compare are values decoded from the candidate's report:
lists, tuples, dicts, sets, numbers, strings, and an opaque object (equal only to itself) for
anything else. An exception the candidate raised is re-raised in the grader as the builtin
exception of that name (else `RuntimeError`).
"""

from __future__ import annotations

import inspect
import json
from typing import TYPE_CHECKING, Any

from posttrain.verifiers.base import Verdict, VerifierError, verdict
from posttrain.verifiers.candidate import DECODE_SOURCE, encode_value, run_candidate
from posttrain.verifiers.grading import GRADER_MARGIN_S, grading_sandbox, run_grader

if TYPE_CHECKING:
    from posttrain.values.task import Task
    from posttrain.verifiers.base import Outcome, Verifier

MAX_ROUNDS = 4
"""grading-sandbox runs of the tests after the first; each may ask the candidate for arguments
that depend on the candidate's earlier answers"""

GRADER = inspect.getsource(encode_value) + "\n" + DECODE_SOURCE + r'''
import builtins, random

p = _PAYLOAD
if p["results"]:
    policy_input()  # the candidate's results are decoded and compared from here on


def _decode(r):
    try:
        return decode_value(r)
    except (ValueError, TypeError, KeyError, RecursionError):
        return Opaque("undecodable")


known = {key: r for key, r in p["results"]}
unknown = []


class _NeedCall(BaseException):
    """a call the candidate has no result for (BaseException: a test's `except Exception`
    does not swallow it)"""


reference = None
if p["reference"]:
    rns = {"__name__": "reference"}
    exec(compile(p["reference"], "reference.py", "exec"), rns)
    reference = rns.get(p["entry_point"])


def candidate(*args):
    key = json.dumps(encode_value(list(args), 0, True), sort_keys=True)
    r = known.get(key)
    if r is not None:
        if "out" in r:
            return _decode(r["out"])
        kind = getattr(builtins, str(r.get("exc_type")), None)
        if not (isinstance(kind, type) and issubclass(kind, Exception)):
            kind = RuntimeError
        raise kind(str(r.get("exc", ""))[:300])
    if key not in unknown:
        unknown.append(key)
    if reference is None:
        raise _NeedCall()
    return reference(*args)


ns = {"__name__": "tests"}
if p["stub"]:
    exec(compile(p["stub"], "stub.py", "exec"), ns)
exec(compile(p["test"], "tests.py", "exec"), ns)
random.seed(0)
error = None
try:
    ns["check"](candidate)
except _NeedCall:
    error = "needs more calls"
except BaseException as e:
    error = f"{type(e).__name__}: {e}"[:500]
emit({"unknown": unknown[:2000], "error": error})
'''


def grade_check_mode(verifier: Verifier, task: Task, outcome: Outcome, sandbox: Any,
                     code: str, stub: str, timeout: float, label: str) -> Verdict:
    s = task.verifier
    reference = task.reference.get("solution") if isinstance(task.reference, dict) else None
    base = {"test": s["test"], "stub": s.get("stub") or "", "entry_point": s["entry_point"],
            "reference": reference if isinstance(reference, str) else ""}
    known: dict[str, dict] = {}
    seconds = 0.0
    with grading_sandbox(outcome.sandbox, ()) as grader:
        for round_ in range(MAX_ROUNDS + 1):
            found = run_grader(grader, GRADER, {**base, "results": list(known.items())},
                               timeout=timeout + GRADER_MARGIN_S, label=label)
            unknown = [k for k in found.get("unknown") or [] if isinstance(k, str) and k not in known]
            if not unknown:
                if round_ == 0:
                    raise VerifierError(f"{label}: the tests never call the candidate")
                error = found.get("error")
                return verdict(verifier, error is None, reason=None if error is None else "tests failed",
                               error=error, calls=len(known), rounds=round_, seconds=round(seconds, 3))
            if round_ == 0 and found.get("error") is not None and base["reference"]:
                raise VerifierError(f"{label}: the reference solution fails the tests: {found['error']}")
            if round_ == MAX_ROUNDS:
                break
            run = run_candidate(sandbox, code, stub, s["entry_point"], [json.loads(k) for k in unknown],
                                decode=True, timeout=timeout, label=label)
            seconds += run.seconds
            if run.load_error is not None:
                return verdict(verifier, False, reason="code failed to load", error=run.load_error,
                               output_tail=run.output_tail)
            missing = [i for i in range(len(unknown)) if i not in run.results]
            if missing:
                return verdict(verifier, False, reason=run.ended or "the candidate stopped before "
                               "answering every call", calls_answered=len(unknown) - len(missing),
                               calls=len(unknown), output_tail=run.output_tail)
            known.update((key, run.results[i]) for i, key in enumerate(unknown))
    return verdict(verifier, False, reason=f"the tests still asked for new arguments after "
                                           f"{MAX_ROUNDS} rounds", calls=len(known))
