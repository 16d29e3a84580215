"""Regression baselines: a frozen task set plus one policy version's verdicts on it.

    posttrain eval baseline create --policy base --tasks 'math.*,text.*' --size 100 --out base.json
    posttrain eval --policy run-1/step-40 --baseline base.json     # exit 1 on a significant regression

File format (`posttrain.baseline/1`): `{"format", "name", "created_at", "tasks": [Task, ...],
"result": <posttrain.eval/1 result of the baseline policy on exactly those tasks>}`. The tasks are
stored whole, so the baseline stays valid when generators change; the gate re-runs the candidate
with the baseline's own eval config (k, seed, temperature, ...), so every sample is paired with the
baseline's sample of the same seed, and compares with `posttrain.evaluation.ab.compare`.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from posttrain.evaluation.ab import ABReport, compare
from posttrain.evaluation.config import EvalConfig
from posttrain.evaluation.result import EvalFileError, EvalResult
from posttrain.evaluation.runner import run_eval
from posttrain.evaluation.tasksets import TaskList, TaskSetError, parse_task, stratified
from posttrain.policies.base import Policy

if TYPE_CHECKING:
    from posttrain.storage.store import Store

BASELINE_FORMAT = "posttrain.baseline/1"


@dataclass
class Baseline:
    name: str
    tasks: TaskList
    result: EvalResult
    created_at: float = 0.0

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        body = {"format": BASELINE_FORMAT, "name": self.name, "created_at": self.created_at or time.time(),
                "tasks": [t.model_dump(mode="json") for _, t in self.tasks], "result": self.result.to_dict()}
        path.write_text(json.dumps(body, separators=(",", ":")))
        return path

    @classmethod
    def load(cls, path: str | Path) -> Baseline:
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise EvalFileError(f"{path}: no such baseline file") from None
        except json.JSONDecodeError as e:
            raise EvalFileError(f"{path}: not JSON ({e})") from None
        if not isinstance(data, dict) or data.get("format") != BASELINE_FORMAT:
            got = data.get("format") if isinstance(data, dict) else type(data).__name__
            raise EvalFileError(f"{path}: field 'format' is {got!r}, expected {BASELINE_FORMAT!r}")
        for key in ("tasks", "result"):
            if key not in data:
                raise EvalFileError(f"{path}: missing field {key!r}")
        try:
            tasks = [parse_task(obj, f"{path}: tasks[{i}]") for i, obj in enumerate(data["tasks"])]
        except TaskSetError as e:
            raise EvalFileError(str(e)) from None
        result = EvalResult.from_dict(data["result"], where=f"{path}: field 'result'")
        missing = {t.hash for _, t in tasks} ^ {r.hash for r in result.records}
        if missing:
            raise EvalFileError(f"{path}: 'tasks' and 'result.records' disagree on {len(missing)} task(s)")
        return cls(name=data.get("name", path.stem), tasks=tasks, result=result,
                   created_at=float(data.get("created_at", 0.0)))


def create_baseline(policy: Policy, candidates: TaskList, size: int, config: EvalConfig = EvalConfig(), *,
                    name: str = "", policy_spec: str = "", task_source: str = "") -> Baseline:
    """Freeze `size` tasks (spread evenly over domains) and `policy`'s verdicts on them."""
    if size < 1:
        raise ValueError(f"baseline size must be >= 1, got {size}")
    tasks = stratified(candidates, size)
    if len(tasks) < size:
        raise ValueError(f"baseline size {size}: the task set has only {len(tasks)} distinct tasks "
                         "(raise --per-domain or match more domains)")
    result = run_eval(policy, tasks, config, name=name or f"baseline-{policy.version.name}",
                      policy_spec=policy_spec, task_source=task_source)
    return Baseline(name=result.name, tasks=tasks, result=result, created_at=time.time())


@dataclass
class GateResult:
    baseline: Baseline
    candidate: EvalResult
    report: ABReport

    @property
    def passed(self) -> bool:
        return not self.report.regressions

    def lines(self) -> list[str]:
        """Human-readable verdict, naming every regressed domain."""
        o = self.report.overall
        head = (f"baseline {self.baseline.name} ({self.report.a}) -> {self.report.b}: pass@1 "
                f"{o['pass1_a']:.3f} -> {o['pass1_b']:.3f} (diff {o['diff']:+.3f}, "
                f"CI [{o['ci'][0]:+.3f}, {o['ci'][1]:+.3f}], McNemar p {o['mcnemar_p']:.3g})")
        out = [head]
        for dom in self.report.regressions:
            v = o if dom == "overall" else self.report.domains[dom]
            out.append(f"REGRESSION {dom}: pass@1 {v['pass1_a']:.3f} -> {v['pass1_b']:.3f} "
                       f"(diff {v['diff']:+.3f}, CI [{v['ci'][0]:+.3f}, {v['ci'][1]:+.3f}], "
                       f"p {v.get('p_holm', v['mcnemar_p']):.3g})")
        out += [f"warning: {w}" for w in self.report.warnings]
        out.append("no significant regression" if self.passed else
                   f"{len(self.report.regressions)} significant regression(s)")
        return out


def gate(baseline: Baseline, policy: Policy, *, name: str = "", policy_spec: str = "", store: Store | None = None,
         alpha: float = 0.05) -> GateResult:
    """Run `policy` on the baseline's tasks with the baseline's config and compare."""
    config = baseline.result.config
    candidate = run_eval(policy, baseline.tasks, config, name=name or f"gate-{policy.version.name}",
                         policy_spec=policy_spec, task_source=f"baseline:{baseline.name}", store=store)
    report = compare(baseline.result, candidate, alpha=alpha, confidence=config.confidence,
                     bootstrap_samples=config.bootstrap_samples, seed=config.seed)
    return GateResult(baseline, candidate, report)
