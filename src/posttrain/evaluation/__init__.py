"""Evaluation: per-domain pass@k with confidence intervals, rework, cost and latency; paired A/B;
regression baselines; train/eval contamination; forgetting; verifier noise; the HTML report.

The public API (imported lazily, so `import posttrain.evaluation` stays cheap for the CLI):

    resolve_policy(spec, run_dir=None) -> Policy
    resolve_tasks(spec, per_domain=20) -> list[(Domain, Task)]
    run_eval(policy, tasks, config=EvalConfig(), *, name=, policy_spec=, task_source=, store=,
             sandbox_factory=) -> EvalResult
    compare(a: EvalResult, b: EvalResult, *, alpha=0.05, ...) -> ABReport
    create_baseline(policy, tasks, size, config) -> Baseline;  gate(baseline, policy) -> GateResult
    check_contamination(train_tasks, eval_tasks, threshold=0.8) -> ContaminationReport
    guard_training(report, run_dir, allow=False)          # raises ContaminationError
    forgetting_report(before, after, trained_domains) -> dict;  write_forgetting(run_dir, report, name)
    measure_noise(store, k=3) -> NoiseReport;  load_quarantine(run_dir) -> set[str]
    build_report(run_dir, out=None) -> Path
    pass_at_k(n, c, k), wilson_interval(p, n), mcnemar_exact(b, c)
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "EvalConfig": "config", "EvalResult": "result", "EvalFileError": "result", "run_evals": "result",
    "TaskRecord": "records", "Sample": "records",
    "resolve_policy": "policy", "PolicySpecError": "policy", "SeededPolicy": "policy",
    "resolve_tasks": "tasksets", "save_task_set": "tasksets", "load_task_file": "tasksets",
    "tasks_from_domains": "tasksets", "TaskSetError": "tasksets",
    "run_eval": "runner",
    "compare": "ab", "ABReport": "ab",
    "Baseline": "baseline", "create_baseline": "baseline", "gate": "baseline", "GateResult": "baseline",
    "check_contamination": "contamination", "ContaminationReport": "contamination",
    "ContaminationConfig": "contamination", "ContaminationError": "contamination",
    "guard_training": "contamination",
    "forgetting_report": "forgetting", "write_forgetting": "forgetting",
    "measure_noise": "noise", "NoiseReport": "noise", "load_quarantine": "noise",
    "update_quarantine": "noise", "write_noise": "noise",
    "build_report": "report",
    "pass_at_k": "metrics", "wilson_interval": "metrics", "mcnemar_exact": "metrics", "holm": "metrics",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'posttrain.evaluation' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"posttrain.evaluation.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
