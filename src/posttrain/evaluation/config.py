"""`EvalConfig`: every knob of one evaluation, recorded in its result so it can be re-run."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from posttrain.evaluation.metrics import CIMethod


@dataclass(frozen=True)
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

    def __post_init__(self) -> None:
        ks = tuple(sorted(set(int(k) for k in self.k)))
        object.__setattr__(self, "k", ks)
        problems = []
        if not ks or ks[0] < 1:
            problems.append(f"k must be positive integers, got {self.k!r}")
        if self.tasks_per_domain < 1:
            problems.append(f"tasks_per_domain must be >= 1, got {self.tasks_per_domain}")
        if self.temperature < 0:
            problems.append(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            problems.append(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_tokens < 1:
            problems.append(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.workers < 1:
            problems.append(f"workers must be >= 1, got {self.workers}")
        if self.retries < 0:
            problems.append(f"retries must be >= 0, got {self.retries}")
        if self.ci not in ("wilson", "bootstrap"):
            problems.append(f"ci must be 'wilson' or 'bootstrap', got {self.ci!r}")
        if not 0 < self.confidence < 1:
            problems.append(f"confidence must be in (0, 1), got {self.confidence}")
        if self.bootstrap_samples < 100:
            problems.append(f"bootstrap_samples must be >= 100, got {self.bootstrap_samples}")
        if problems:
            raise ValueError("EvalConfig: " + "; ".join(problems))

    @property
    def n_samples(self) -> int:
        return max(self.k)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["k"] = list(self.k)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "EvalConfig") -> EvalConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"{where}: unknown eval config field(s) {', '.join(unknown)}")
        d = dict(d)
        if "k" in d:
            d["k"] = tuple(d["k"])
        return cls(**d)

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
