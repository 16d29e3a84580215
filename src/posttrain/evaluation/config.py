"""`EvalConfig`: every knob of one evaluation, recorded in its result so it can be re-run.

A settings class (`posttrain.settings`): pydantic checks the types, `_rules` the values; a run
config's `[eval]` section is this class with the run's defaults (`posttrain.pipeline.config`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from pydantic import field_validator, model_validator

from posttrain.evaluation.metrics import CIMethod
from posttrain.settings import check, from_data, settings, to_data


@settings
class EvalConfig:
    k: tuple[int, ...] = (1,)
    """pass@k values to report; every task is sampled n = max(k) times"""
    tasks_per_domain: int = 20
    """when the task set is given as domain globs: eval-split seeds 0..N-1 per domain (a small
    domain that repeats a problem keeps it once, so it may contribute fewer tasks)"""
    temperature: float = 1.0
    """sampling temperature (0 = greedy; pass@k for k > 1 then measures nothing new)"""
    top_p: float = 1.0
    """nucleus sampling mass"""
    max_tokens: int = 4096
    """cap on new tokens per turn; each task's own `limits.max_tokens` still applies"""
    seed: int = 0
    """base seed: sample j of a task always gets the same sampling seed, so two runs (or two
    policies in an A/B) see identical tasks, prompts and seeds"""
    workers: int = 2
    """environment steps (and sandboxes) in parallel"""
    retries: int = 1
    """re-runs of an episode that ended in infra_error (the error is still counted in the rate)"""
    ci: CIMethod = "wilson"
    """confidence interval method: 'wilson' or 'bootstrap' (see posttrain.evaluation.metrics)"""
    confidence: float = 0.95
    """confidence level of every interval"""
    bootstrap_samples: int = 2000
    """resamples of bootstrap intervals (and of A/B paired bootstraps)"""

    @field_validator("k", mode="after")
    @classmethod
    def _sorted_k(cls, k: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(sorted(set(k)))

    @model_validator(mode="after")
    def _rules(self) -> EvalConfig:
        check(bool(self.k) and self.k[0] >= 1, self, "k", "must be positive integers")
        check(self.tasks_per_domain >= 1, self, "tasks_per_domain", "must be >= 1")
        check(self.temperature >= 0, self, "temperature", "must be >= 0")
        check(0 < self.top_p <= 1, self, "top_p", "must be in (0, 1]")
        check(self.max_tokens >= 1, self, "max_tokens", "must be >= 1")
        check(self.workers >= 1, self, "workers", "must be >= 1")
        check(self.retries >= 0, self, "retries", "must be >= 0")
        check(0 < self.confidence < 1, self, "confidence", "must be in (0, 1)")
        check(self.bootstrap_samples >= 100, self, "bootstrap_samples", "must be >= 100")
        return self

    @property
    def n_samples(self) -> int:
        return max(self.k)

    def to_dict(self) -> dict[str, Any]:
        """This evaluation's own fields (a subclass's extra fields, such as a run config's
        `[eval]` section, are not part of the recorded evaluation)."""
        return {f.name: to_data(self)[f.name] for f in fields(EvalConfig)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "EvalConfig") -> EvalConfig:
        return from_data(cls, d, where)

    @staticmethod
    def parse_k(text: str) -> tuple[int, ...]:
        """'1,8' -> (1, 8), with an error naming the bad value."""
        try:
            ks = tuple(int(x) for x in text.split(",") if x.strip())
        except ValueError:
            raise ValueError(f"--k must be comma-separated positive integers like '1,8', got {text!r}") from None
        if not ks or min(ks) < 1:
            raise ValueError(f"--k must be comma-separated positive integers like '1,8', got {text!r}")
        return ks
