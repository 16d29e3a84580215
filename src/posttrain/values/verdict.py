"""`Verdict`: what a verifier decided about one episode. A plain value, imported by everything
that grades, stores or trains on an episode."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Verdict:
    passed: bool
    score: float
    """in [0, 1]; 1.0 when passed for binary verifiers"""
    details: Mapping[str, Any] = field(default_factory=dict)
    """why: parse errors, which check failed, measured values (JSON-serialisable)"""
    verifier_version: str = ""
    """'<verifier name>@<version>': changes whenever grading could change"""

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["details"] = dict(self.details)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Verdict:
        return cls(passed=bool(d["passed"]), score=float(d["score"]),
                   details=dict(d.get("details") or {}), verifier_version=d.get("verifier_version", ""))
