"""`EvalResult`: one policy evaluated on one task set, and its file format.

`posttrain eval --run-dir RUN` writes `RUN/evals/<name>.json`:

    {"format": "posttrain.eval/1",
     "name": "base-eval", "policy": "<policy version name>", "policy_spec": "<--policy as given>",
     "created_at": <unix time>, "wall_s": <seconds>, "task_source": "<--tasks as given>",
     "config": {EvalConfig fields},
     "summary": {"domains": {<domain>: {...}}, "families": {...}, "macro_pass1", "micro_pass1",
                 "infra_error_rate", ...},          # see posttrain.evaluation.summary
     "records": [{"hash", "key", "domain", "family", "env", "split", "seed",
                  "samples": [{"index", "status", "passed", "score", "turns", ...}]}]}

`records` are the source of truth (A/B tests pair on them); `summary` is recomputed from them on
load and kept in the file for readers that only want the numbers.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import time
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from posttrain.errors import writing
from posttrain.evaluation.config import EvalConfig
from posttrain.evaluation.records import TaskRecord
from posttrain.evaluation.summary import summarize

FORMAT = "posttrain.eval/1"
EVALS_DIR = "evals"


class EvalFileError(ValueError):
    """An eval result file that cannot be read; the message names the file and the field."""


def safe_name(name: str) -> str:
    """A file-name-safe version of `name` (policy names contain '/' and ':')."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.") or "eval"


@dataclass
class EvalResult:
    name: str
    policy: str
    """the policy version name (`Policy.version.name`)"""
    config: EvalConfig
    records: list[TaskRecord]
    policy_spec: str = ""
    task_source: str = ""
    created_at: float = field(default_factory=time.time)
    wall_s: float = 0.0
    reused: dict[str, Any] = field(default_factory=dict)
    """where some samples were copied from instead of drawn (`posttrain.evaluation.reuse`):
    {"from": the other run's directory, "samples": how many}; empty when all were drawn here"""

    @cached_property
    def summary(self) -> dict[str, Any]:
        c = self.config
        return summarize(self.records, c.k, ci=c.ci, confidence=c.confidence,
                         bootstrap_samples=c.bootstrap_samples, seed=c.seed)

    def brief(self) -> dict[str, Any]:
        """What `posttrain eval --json` prints."""
        s = self.summary
        return {"domains": s["domains"], "families": s["families"], "macro_pass1": s["macro_pass1"],
                "micro_pass1": s["micro_pass1"], "infra_error_rate": s["infra_error_rate"],
                "policy": self.policy, "name": self.name, "k": list(self.config.k),
                "episodes": s["episodes"], "tasks": s["tasks"], "wall_s": round(self.wall_s, 3)}

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "name": self.name, "policy": self.policy, "policy_spec": self.policy_spec,
                "created_at": self.created_at, "wall_s": round(self.wall_s, 6),
                "task_source": self.task_source, "config": self.config.to_dict(),
                **({"reused": self.reused} if self.reused else {}),
                "summary": self.summary, "records": [r.to_dict() for r in self.records]}

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "eval result") -> EvalResult:
        if d.get("format") != FORMAT:
            raise EvalFileError(f"{where}: field 'format' is {d.get('format')!r}, expected {FORMAT!r}")
        try:
            return cls(name=d["name"], policy=d["policy"],
                       config=EvalConfig.from_dict(d["config"], where=f"{where}: field 'config'"),
                       records=[TaskRecord.from_dict(r) for r in d["records"]],
                       policy_spec=d.get("policy_spec", ""), task_source=d.get("task_source", ""),
                       created_at=float(d.get("created_at", 0.0)), wall_s=float(d.get("wall_s", 0.0)),
                       reused=dict(d.get("reused") or {}))
        except KeyError as e:
            raise EvalFileError(f"{where}: missing field {e.args[0]!r}") from None
        except (TypeError, ValueError) as e:
            raise EvalFileError(f"{where}: {e}") from None

    def save(self, path: str | Path) -> Path:
        """Write atomically (temp file + rename), so a reader never sees half a result."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with writing(path, "writing an evaluation"):
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
            try:
                with os.fdopen(fd, "w") as f:
                    json.dump(self.to_dict(), f, separators=(",", ":"))
                os.replace(tmp, path)
            finally:
                Path(tmp).unlink(missing_ok=True)
        return path

    def save_to_run(self, run_dir: str | Path) -> Path:
        return self.save(Path(run_dir) / EVALS_DIR / f"{safe_name(self.name)}.json")

    @classmethod
    def load(cls, path: str | Path) -> EvalResult:
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise EvalFileError(f"{path}: no such eval result file") from None
        except json.JSONDecodeError as e:
            raise EvalFileError(f"{path}: not JSON ({e})") from None
        if not isinstance(data, dict):
            raise EvalFileError(f"{path}: expected a JSON object")
        return cls.from_dict(data, where=str(path))


def run_evals(run_dir: str | Path) -> list[EvalResult]:
    """Every eval result saved in `RUN/evals/`, oldest first (files that fail to load raise)."""
    folder = Path(run_dir) / EVALS_DIR
    results = [EvalResult.load(p) for p in sorted(folder.glob("*.json"))] if folder.is_dir() else []
    return sorted(results, key=lambda r: (r.created_at, r.name))
