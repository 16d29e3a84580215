"""The verifier contract: a program decides the outcome.

A verifier is deterministic and versioned. It reads the episode's `Outcome` (the submitted answer
and, for workspace tasks, the sandbox the episode acted in) and returns a `Verdict`.

Two failures must never be confused:

* the answer is wrong, malformed, empty, NaN, or the candidate's code crashes or hangs: that is a
  `Verdict(passed=False, ...)` with the reason in `details`;
* the verifier itself could not do its job (its own check script crashed, the sandbox it needed
  died, it timed out while the candidate was not running): raise `VerifierError`. The episode is
  recorded as `infra_error` and retried; it is never scored 0.

Verifiers never trust anything the policy could have written: check scripts and hidden tests are
sent into the sandbox at grading time, run with `python -I` (the workspace is not on `sys.path`),
and a result file in the workspace is never read as the reward.
"""

from __future__ import annotations

from dataclasses import dataclass
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


def verdict(verifier: Verifier, passed: bool, score: float | None = None, **details: Any) -> Verdict:
    """Build a Verdict stamped with `verifier`'s name and version."""
    return Verdict(passed=passed, score=float(passed) if score is None else float(score),
                   details=details, verifier_version=f"{verifier.name}@{verifier.version}")
