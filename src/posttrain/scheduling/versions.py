"""The infrastructure-error rate of each policy version, and a flag when it jumps.

A policy under RL can learn to break its graders (kill them, crash them with a deep report) or
its sandboxes; such failures surface as `infra_error`, which is retried rather than scored, so
the trainer never sees them. What does show is the rate: a version whose episodes fail on
infrastructure far more often than the versions before it has probably learned something it
should not have. `VersionInfraRate` counts every finished episode by the policy version that
generated it and flags (once, with a reason) a version whose rate jumps above the pooled rate of
the earlier versions. It only reports: a person (or the caller) decides what to do.

Pure and synchronous, like the scheduler core: the runner feeds it and puts `metrics()` into the
scheduler's metrics.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("posttrain.scheduling")


class VersionInfraRate:
    def __init__(self, min_episodes: int = 20, jump: float = 0.1, factor: float = 2.0,
                 keep: int = 50) -> None:
        """A version is flagged once it has `min_episodes` episodes and its infra-error rate is
        both `jump` above and `factor` times the pooled rate of every earlier version (which
        together need `min_episodes` too: the first version has nothing to jump from).
        `keep` bounds how many versions' counts are kept (the oldest are folded into the
        baseline)."""
        if min_episodes < 1 or jump < 0 or factor < 1 or keep < 2:
            raise ValueError(f"VersionInfraRate: min_episodes >= 1, jump >= 0, factor >= 1, keep >= 2; "
                             f"got {min_episodes}, {jump}, {factor}, {keep}")
        self.min_episodes, self.jump, self.factor, self.keep = min_episodes, jump, factor, keep
        self.counts: dict[str, list[int]] = {}
        """version -> [episodes, infra errors], in the order versions first finished an episode"""
        self._folded = [0, 0]
        """counts of versions dropped past `keep` (still part of every later baseline)"""
        self.flagged: dict[str, dict[str, Any]] = {}
        """version -> why it was flagged: its rate, the baseline, episodes"""

    def record(self, version: str, infra_error: bool) -> dict[str, Any] | None:
        """Count one finished episode of `version`; returns the report when this flags it."""
        c = self.counts.get(version)
        if c is None:
            c = self.counts[version] = [0, 0]
            if len(self.counts) > self.keep:
                oldest = next(iter(self.counts))
                old = self.counts.pop(oldest)
                self._folded = [self._folded[0] + old[0], self._folded[1] + old[1]]
        c[0] += 1
        c[1] += infra_error
        if not infra_error or version in self.flagged or c[0] < self.min_episodes:
            return None
        base_n, base_err = self._baseline(version)
        if base_n < self.min_episodes:
            return None
        rate, base = c[1] / c[0], base_err / base_n
        if rate - base < self.jump or rate < self.factor * base:
            return None
        report = {"rate": round(rate, 4), "baseline": round(base, 4), "episodes": c[0],
                  "baseline_episodes": base_n}
        self.flagged[version] = report
        log.warning("policy version %s: infrastructure-error rate %.1f%% over %d episodes, against "
                    "%.1f%% for the versions before it: it may have learned to break its graders "
                    "or sandboxes (the errors are retried, not scored)",
                    version, 100 * rate, c[0], 100 * base)
        return report

    def _baseline(self, version: str) -> tuple[int, int]:
        n, err = self._folded
        for v, (vn, verr) in self.counts.items():
            if v == version:
                break
            n, err = n + vn, err + verr
        return n, err

    def rate(self, version: str) -> float | None:
        c = self.counts.get(version)
        return c[1] / c[0] if c and c[0] else None

    def metrics(self) -> dict[str, Any]:
        return {"by_version": {v: {"episodes": n, "infra_errors": e, "rate": round(e / n, 4)}
                               for v, (n, e) in self.counts.items()},
                "flagged": dict(self.flagged)}
