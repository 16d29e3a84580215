"""`metrics.jsonl`: one line per trainer step, keyed by its step, written once.

A run killed after logging steps its last checkpoint does not hold resumes from that checkpoint and
trains those steps again; `resume(step)` first cuts the file back to the checkpoint's step (and
cuts a torn last line a kill left mid-write), so each step is logged once, by the run that the
checkpoints continue. `write` refuses a step at or below the last one logged.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from posttrain.errors import writing

DOMAIN_SCHED_KEYS = ("tier", "quota", "sample_share", "cost_share", "effective_weight", "samples", "cost",
                     "sandbox_s", "gen_s", "tokens", "queue_wait_p50_s", "queue_wait_p99_s",
                     "max_service_gap_s", "infra_errors", "retries", "groups_dropped", "signal_share")
"""the scheduler's per-domain figures written into metrics.jsonl every `checkpoint_every` steps"""


class MetricsLog:
    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self.last_step = 0

    def resume(self, step: int) -> int:
        """Keep the whole lines of steps <= `step` (the checkpoint resumed from); returns how many
        lines were cut (a torn tail, steps past the checkpoint)."""
        if not self.path.exists():
            self.last_step = 0
            return 0
        data = self.path.read_bytes()
        keep: list[bytes] = []
        cut = 0
        for line in data.split(b"\n"):
            if not line:
                continue
            try:
                row = json.loads(line)
            except ValueError:  # a line torn by a kill (only ever the last one)
                cut += 1
                continue
            if int(row.get("step", 0)) <= step:
                keep.append(line)
            else:
                cut += 1
        if cut or not data.endswith(b"\n"):
            tmp = self.path.with_suffix(".jsonl.tmp")
            try:
                with writing(self.path, "writing metrics"):
                    tmp.write_bytes(b"".join(line + b"\n" for line in keep))
                    os.replace(tmp, self.path)
            finally:
                tmp.unlink(missing_ok=True)
        self.last_step = max((int(json.loads(line)["step"]) for line in keep), default=0)
        return cut

    def write(self, row: Mapping[str, Any]) -> bool:
        """Append `row` (it has a 'step'); False if that step is already logged."""
        step = int(row["step"])
        if step <= self.last_step:
            return False
        size = self.path.stat().st_size if self.path.exists() else 0
        try:
            with writing(self.path, "writing metrics"), open(self.path, "a", encoding="utf-8") as f:
                f.write(json.dumps(row, default=str) + "\n")
        except OSError:
            with contextlib.suppress(OSError):  # no torn line left behind: the file as it was
                os.truncate(self.path, size)
            raise
        self.last_step = step
        return True


def step_row(step: int, metrics: Mapping[str, Any], groups: Sequence[Any], sched: Mapping[str, Any]) -> dict[str, Any]:
    """One step's line: the trainer's figures, reward per domain and family, staleness, and the
    scheduler's figures (its per-domain table only when `sched` holds one)."""
    row: dict[str, Any] = {"step": step, "time": time.time(),
                           **{k: v for k, v in metrics.items() if isinstance(v, (int, float))}}
    by_family: dict[str, list[float]] = {}
    for g in groups:
        by_family.setdefault(g.domain.split(".")[0], []).extend(g.rewards)
        row.setdefault(f"domain/{g.domain}/reward", [])
        row[f"domain/{g.domain}/reward"].extend(g.rewards)
    for key in [k for k in row if k.startswith("domain/")]:
        vals = row[key]
        row[key] = sum(vals) / len(vals) if vals else None
    for fam, vals in by_family.items():
        row[f"family/{fam}/reward"] = sum(vals) / len(vals)
        row[f"family/{fam}/pass_rate"] = sum(v >= 1.0 for v in vals) / len(vals)
    row["staleness_max"] = max((g.staleness for g in groups), default=0)
    for key in ("generator_busy", "worker_utilization", "infra_errors", "retries", "lost",
                "queue_wait_p50_s", "queue_wait_p99_s", "max_wait_s"):
        if key in sched:
            row[f"sched/{key}"] = sched[key]
    for key in ("quarantined", "retired", "exhausted"):  # domain -> why is in scheduler.json
        row[f"sched/{key}"] = sorted(sched.get(key) or {})
    if "domains" in sched:  # every checkpoint_every steps: per domain, against its quota
        row["sched/domains"] = {d: {k: v[k] for k in DOMAIN_SCHED_KEYS if k in v}
                                for d, v in sched["domains"].items()}
    return row
