"""The verifier contract: a program decides the outcome.

A verifier is deterministic and versioned. It reads the episode's `Outcome` (the submitted answer
and, for workspace tasks, the sandbox the episode acted in) and returns a `Verdict`.

Two failures must never be confused:

* the answer is wrong, malformed, empty, NaN, or the candidate's code crashes or hangs: that is a
  `Verdict(passed=False, ...)` with the reason in `details`;
* the verifier itself could not do its job before anything the policy made was involved (its
  sandbox could not boot, its own program failed before reading the workspace or starting
  candidate code): raise `VerifierError`. The episode is recorded as `infra_error` and retried;
  it is never scored 0;
* the grader died, hung or garbled its report *after* candidate code ran or policy files were
  read: the policy may have caused it (killed the grader, fed it a pathological file), so it is a
  failed verdict (`GradingFailed`, `failed_grading`), reason recorded.

Verifiers never trust anything the policy could have written: grading runs in a fresh sandbox
holding copies of the task's declared artifacts (`verifiers/grading.py`), check scripts and hidden
tests are sent in at grading time, run with `python -I` (the workspace is not on `sys.path`),
and a result file in the workspace is never read as the reward.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from posttrain.values.verdict import Verdict

if TYPE_CHECKING:
    from posttrain.sandbox.base import Sandbox
    from posttrain.values.task import Task


@dataclass(frozen=True)
class Outcome:
    """What an episode produced, as the verifier sees it."""

    answer: str | None
    """the submitted answer text (single-answer envs: the whole completion); None if none"""
    sandbox: Sandbox | None = None
    """the episode's sandbox, for workspace tasks (the verifier may run checks in it)"""


class VerifierError(RuntimeError):
    """The verifier could not grade (infrastructure), as opposed to a wrong answer."""


class GradingFailed(Exception):
    """The grader died, hung or garbled its report *after* it had run or read something the
    policy made (candidate code, a workspace file). The policy could have caused that, so it is
    a failed verdict with this reason, never an infrastructure error (which would be dropped and
    retried: a policy that kills its grader would otherwise never be scored 0)."""


def failed_grading(verifier: Verifier, e: GradingFailed, **details: Any) -> Verdict:
    """The verdict of an episode whose grading failed after policy input (see `GradingFailed`)."""
    return verdict(verifier, False, reason=f"grading failed after the policy's code or files were "
                                           f"used: {e}"[:600], grader_failed=True, **details)


@runtime_checkable
class Verifier(Protocol):
    # read-only members: a class attribute or a frozen dataclass field satisfies them
    @property
    def name(self) -> str: ...

    @property
    def version(self) -> str: ...

    @property
    def needs_sandbox(self) -> bool:
        """True when `verify` runs anything in `outcome.sandbox` (code tests, check scripts)"""
        ...

    def verify(self, task: Task, outcome: Outcome) -> Verdict: ...


INVALID_SCORE = "invalid_score"
"""the `details` key of a verdict whose verifier broke the contract (`held_to_contract`)"""


def held_to_contract(verifier: Verifier, v: object) -> Verdict:
    """What `verifier.verify` returned, as a verdict the trainer can use: `passed` a bool and
    `score` a finite number in [0, 1]. Every episode's grade goes through this (the environments,
    a re-score, `tasks check`), because a third-party verifier is code nobody here wrote and its
    score is read straight into the advantages: one nan turns a whole group's into nan, and a
    score of 1e9 outweighs every other group of the step. So:

    * not a `Verdict` at all (None, a float): the verifier is broken before any answer matters,
      `VerifierError` (infrastructure: recorded, retried, the domain quarantined if it persists);
    * a `passed` that is not a bool (a candidate's object whose `__bool__` says True, passed
      through) or a score that is nan, infinite or outside [0, 1] (a formula fed the answer "inf"):
      the answer may have caused it, so it is a failed verdict with score 0, what the verifier
      said kept in `details` under `invalid_score`; `tasks check` fails the domain on it.
    """
    if not isinstance(v, Verdict):
        raise VerifierError(f"verifier {verifier.name!r} returned {type(v).__name__}, not a Verdict")
    passed, score = v.passed, v.score
    if type(passed).__module__ == "numpy" and type(passed).__name__ in ("bool", "bool_"):
        passed = bool(passed)  # numpy's bool is not a subclass of bool, but means one
    number = isinstance(score, (int, float)) and not isinstance(score, bool)
    if isinstance(passed, bool) and number and math.isfinite(score) and 0.0 <= score <= 1.0:
        return v if passed is v.passed and type(score) is float else replace(v, passed=passed, score=float(score))
    said = f"passed={v.passed!r:.80}, score={v.score!r:.80}"
    return Verdict(passed=False, score=0.0,
                   details={**(v.details if isinstance(v.details, Mapping) else {}), INVALID_SCORE: said,
                            "reason": f"the verifier's verdict broke its contract ({said}; passed must be "
                                      f"a bool, score a finite number in [0, 1]): scored 0"},
                   verifier_version=v.verifier_version)


def verify(verifier: Verifier, task: Task, outcome: Outcome) -> Verdict:
    """`verifier.verify(task, outcome)` held to the contract (`held_to_contract`): how every
    episode, re-score and self-check grades."""
    return held_to_contract(verifier, verifier.verify(task, outcome))


def verdict(verifier: Verifier, passed: bool, score: float | None = None, /, **details: Any) -> Verdict:
    """Build a Verdict stamped with `verifier`'s name and version. `score` is positional only, so
    a detail of any name (a `**details` dict) can never be taken for it."""
    return Verdict(passed=passed, score=float(passed) if score is None else float(score),
                   details=details, verifier_version=f"{verifier.name}@{verifier.version}")
