"""Per-domain judgements the scheduler acts on: infrastructure health and learning signal.

* `Quarantine`: a domain whose infrastructure-error rate over its last episodes passes a threshold
  is quarantined: no new groups, its queued groups dropped (counted), training goes on with the
  rest. Policy-backend errors (`ErrorInfo.where == 'policy'`) are not the domain's fault and are
  not counted. Nothing releases a domain automatically; `release` does (after a fix).
* `PolicyOutage`: how long every episode has failed in the policy backend; past
  `RetryConfig.policy_outage_s` the scheduler gives up instead of retrying forever.
* `SignalTracker`: the adaptive sampling of the trainer tier (see `AdaptiveConfig`).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any

from posttrain.scheduling.config import AdaptiveConfig, QuarantineConfig


class Quarantine:
    def __init__(self, config: QuarantineConfig) -> None:
        self.config = config
        self._windows: dict[str, deque[bool]] = {}
        self._errors: dict[str, int] = {}
        """infra errors in each domain's window (a running count: `record` stays O(1))"""
        self.quarantined: dict[str, dict[str, Any]] = {}
        """domain -> why: error rate, episodes looked at, last error, wall time"""

    def record(self, domain: str, infra_error: bool, error: str = "") -> dict[str, Any] | None:
        """Count one finished episode; returns the report if this quarantines the domain."""
        if domain in self.quarantined:
            return None
        w = self._windows.get(domain)
        if w is None:
            w = self._windows[domain] = deque(maxlen=self.config.window)
            self._errors[domain] = 0
        if len(w) == w.maxlen:
            self._errors[domain] -= w[0]
        w.append(infra_error)
        self._errors[domain] += infra_error
        if len(w) < self.config.min_episodes or not infra_error:
            return None
        rate = self._errors[domain] / len(w)
        if rate <= self.config.max_error_rate:
            return None
        report = {"error_rate": round(rate, 4), "episodes": len(w), "last_error": error[:500],
                  "threshold": self.config.max_error_rate, "at": time.time()}
        self.quarantined[domain] = report
        return report

    def rate(self, domain: str) -> float:
        w = self._windows.get(domain)
        return self._errors[domain] / len(w) if w else 0.0

    def release(self, domain: str) -> None:
        self.quarantined.pop(domain, None)
        self._windows.pop(domain, None)
        self._errors.pop(domain, None)

    def state_dict(self) -> dict[str, Any]:
        return {"windows": {d: [int(x) for x in w] for d, w in self._windows.items()},
                "quarantined": dict(self.quarantined)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._windows = {d: deque((bool(x) for x in w), maxlen=self.config.window)
                         for d, w in state["windows"].items()}
        self._errors = {d: sum(w) for d, w in self._windows.items()}
        self.quarantined = {d: dict(r) for d, r in state["quarantined"].items()}


class PolicyOutage:
    """The current run of episodes that all failed in the policy backend: when it began and the
    last error. Any other outcome (a completion came back) ends it."""

    def __init__(self, limit_s: float | None) -> None:
        self.limit_s = limit_s
        self.since: float | None = None
        self.last_error = ""

    def record(self, failed_in_policy: bool, error: str, now: float) -> None:
        if not failed_in_policy:
            self.ended()
            return
        if self.since is None:
            self.since = now
        self.last_error = error[:500]

    def ended(self) -> None:
        """A completion came back: no outage (needs no clock reading, unlike a failure)."""
        self.since = None

    def reason(self, now: float) -> str | None:
        """Why the scheduler gives up, once the backend has failed everything for `limit_s`."""
        if self.limit_s is None or self.since is None or now - self.since < self.limit_s:
            return None
        return (f"the policy backend has failed every episode for {now - self.since:.0f} s "
                f"(RetryConfig.policy_outage_s = {self.limit_s:g}); last error: {self.last_error}")


def expected_signal(pass_counts: Iterable[tuple[int, int]], group_size: int) -> float | None:
    """The share of a domain's groups of `group_size` samples expected to have a reward spread
    (some pass, some fail), from its tasks' pass counts (`passed`, `samples`) under the policy
    that will sample them: the mean over tasks of 1 - p^G - (1 - p)^G, p = passed / samples.
    Pass/fail stands for the reward (a partial score spreads more). None without a sampled task."""
    shares = [1 - (c / n) ** group_size - (1 - c / n) ** group_size for c, n in pass_counts if n > 0]
    return sum(shares) / len(shares) if shares else None


class SignalTracker:
    def __init__(self, config: AdaptiveConfig) -> None:
        self.config = config
        self.prior: dict[str, float] = {}
        """domain -> expected signal share before any group (`set_prior`)"""
        self._signal: dict[str, deque[bool]] = {}
        self._all_pass_run: dict[str, int] = {}
        self.retired: dict[str, dict[str, Any]] = {}
        """domain -> why: consecutive all-pass groups, wall time"""

    def record(self, domain: str, has_signal: bool, all_passed: bool) -> tuple[float, bool]:
        """Count one completed group; returns (weight multiplier, whether this retires the domain)."""
        if not self.config.enabled:
            return 1.0, False
        w = self._signal.get(domain)
        if w is None:
            w = self._signal[domain] = deque(maxlen=self.config.window)
        w.append(has_signal)
        run = self._all_pass_run[domain] = self._all_pass_run.get(domain, 0) + 1 if all_passed else 0
        retire = (self.config.retire_after is not None and run >= self.config.retire_after
                  and domain not in self.retired)
        if retire:
            self.retired[domain] = {"all_pass_groups_in_a_row": run, "at": time.time()}
        return self.multiplier(domain), retire

    def set_prior(self, prior: Mapping[str, float]) -> None:
        """Each domain's expected signal share (`expected_signal`) stands for
        `AdaptiveConfig.prior_groups` groups at the front of its window; each real group pushes
        one out. Not part of `state_dict`: it is an input, given again on resume."""
        self.prior = {d: min(1.0, max(0.0, float(p))) for d, p in prior.items()}

    def multiplier(self, domain: str) -> float:
        if not self.config.enabled:
            return 1.0
        w = self._signal.get(domain) or ()
        k = min(self.config.prior_groups, self.config.window - len(w)) if domain in self.prior else 0
        n = len(w) + k
        if n < self.config.min_groups:  # min_groups >= 1
            return 1.0
        return max(self.config.floor, (sum(w) + k * self.prior.get(domain, 0.0)) / n)

    def signal_share(self, domain: str) -> float | None:
        w = self._signal.get(domain)
        return sum(w) / len(w) if w else None

    def state_dict(self) -> dict[str, Any]:
        return {"signal": {d: [int(x) for x in w] for d, w in self._signal.items()},
                "all_pass_run": dict(self._all_pass_run), "retired": dict(self.retired)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._signal = {d: deque((bool(x) for x in w), maxlen=self.config.window)
                        for d, w in state["signal"].items()}
        self._all_pass_run = {d: int(n) for d, n in state["all_pass_run"].items()}
        self.retired = {d: dict(r) for d, r in state["retired"].items()}
