"""Experiment tracking: the job's scalars to TensorBoard, W&B, MLflow or trackio.

`open_tracker(config, run_dir, run_name, params)` returns one `Tracker` that fans out to every
configured backend. The job calls `tracker.log(step, row)` with each `metrics.jsonl` row (the
same numbers, flattened: `flatten`) and `tracker.close()` at the end. Each backend is its
library's own writer (`torch.utils.tensorboard.SummaryWriter`, `wandb`, `mlflow`, `trackio`),
imported only when configured; a backend whose library is missing is a clear error before the
run starts, not a silently missing chart.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from posttrain.errors import UserError
from posttrain.tracking.config import LoggingConfig


class TrackingError(UserError):
    """A configured tracker that cannot start (its library is not installed): the config asks for
    something this install cannot do, one line and exit 2 like any bad config."""


class Tracker(Protocol):
    def log(self, step: int, scalars: Mapping[str, float]) -> None: ...

    def close(self) -> None: ...


def flatten(row: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """The numbers of a metrics row under '/'-joined names: nested dicts are walked, booleans are
    0/1, lists count their items (`sched/quarantined` -> `sched/quarantined/count`); None, text
    and non-finite values are left out (no tracker charts them)."""
    out: dict[str, float] = {}
    for key, value in row.items():
        name = f"{prefix}{key}"
        if isinstance(value, bool):
            out[name] = float(value)
        elif isinstance(value, (int, float)):
            if math.isfinite(value) and key not in ("step", "time"):
                out[name] = float(value)
        elif isinstance(value, Mapping):
            out.update(flatten(value, name + "/"))
        elif isinstance(value, (list, tuple)):
            out[f"{name}/count"] = float(len(value))
    return out


def eval_scalars(summary: Mapping[str, Any], name: str) -> dict[str, float]:
    """The headline figures of an evaluation summary (`EvalResult.summary`) as scalars:
    `eval/NAME/<domain>/pass@k`, its infrastructure-error and truncation rates, and each family's
    macro pass@1."""
    out: dict[str, float] = {}
    for domain, v in (summary.get("domains") or {}).items():
        for key, entry in v.items():
            if key.startswith("pass@") and isinstance(entry, Mapping) and entry.get("value") is not None:
                out[f"eval/{name}/{domain}/{key}"] = float(entry["value"])
        for key in ("infra_error_rate", "truncation_rate"):
            if isinstance(v.get(key), (int, float)):
                out[f"eval/{name}/{domain}/{key}"] = float(v[key])
    for family, v in (summary.get("families") or {}).items():
        if isinstance(v.get("macro_pass1"), (int, float)):
            out[f"eval/{name}/family/{family}/macro_pass1"] = float(v["macro_pass1"])
    return out


class _Fanout:
    def __init__(self, trackers: list[Tracker]) -> None:
        self.trackers = trackers

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        for t in self.trackers:
            t.log(step, scalars)

    def close(self) -> None:
        for t in self.trackers:
            t.close()


def open_tracker(config: LoggingConfig, run_dir: Path, run_name: str,
                 params: Mapping[str, Any] | None = None) -> Tracker:
    """Every configured backend behind one `Tracker` (none configured: one that does nothing)."""
    from posttrain.tracking import backends

    made: list[Tracker] = []
    try:
        for name in dict.fromkeys(config.backends):
            made.append(backends.OPENERS[name](config, Path(run_dir), run_name, dict(params or {})))
    except Exception:
        _Fanout(made).close()
        raise
    return _Fanout(made)


__all__ = ["LoggingConfig", "Tracker", "TrackingError", "eval_scalars", "flatten", "open_tracker"]
