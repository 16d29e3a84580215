"""Runs at a glance: every run directory under a parent, with its status, steps, key figures and
the command that resumes it (`posttrain runs`).

Status, from what the directory holds (nothing is asked of a process):

* `running`  -- a process holds the run's lock (`posttrain.runlock`: the kernel drops it however
  the process ends, so a held lock is a live owner);
* `finished` -- `summary.json` was written (the job's last act);
* `failed`   -- the job stopped on an error and said so in `status.json` (`mark`);
* `killed`   -- none of these: the owner is gone without finishing or saying why (kill -9, a
  crash of the machine, Ctrl-C, which `mark`s "interrupted").

Looking at the lock takes it for an instant (shared, non-blocking): a `posttrain run` starting
in that very instant is told the directory is in use, and can simply be started again.
"""

from __future__ import annotations

import fcntl
import json
import os
import shlex
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from posttrain.runlock import LOCK_FILE, holder

STATUS_FILE = "status.json"


@dataclass
class RunInfo:
    name: str
    path: str
    kind: str
    """what made it: 'posttrain run', 'posttrain rollout', 'posttrain eval', or '' if unknown"""
    status: str
    """running, finished, failed or killed (see the module docstring)"""
    step: int | None = None
    """the last trainer step logged"""
    steps: int | None = None
    """the steps the run was configured for"""
    checkpoint_step: int | None = None
    figures: dict[str, float] = field(default_factory=dict)
    """finished: base/final pass@1 (and held-out); otherwise the last step's mean reward"""
    error: str = ""
    updated: float = 0.0
    """last modification time of its metrics or summary (seconds since the epoch)"""
    resume: str = ""
    """the command that continues it (runs that stopped before finishing)"""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def mark(run_dir: str | os.PathLike, status: str, error: str = "") -> None:
    """Record why a run stopped (`failed` with its error, or `interrupted`)."""
    path = Path(run_dir)
    if path.is_dir():
        tmp = path / (STATUS_FILE + ".tmp")
        try:
            tmp.write_text(json.dumps({"status": status, "error": error[:2000], "time": time.time()}) + "\n")
            os.replace(tmp, path / STATUS_FILE)
        except OSError:
            # written while a run stops, often for the very reason (a full disk) being reported:
            # the status is a convenience (`posttrain runs` reads an unmarked dead run as killed),
            # and failing here would hide the error that stopped the run
            tmp.unlink(missing_ok=True)


def lock_held(run_dir: Path) -> bool:
    try:
        fd = os.open(run_dir / LOCK_FILE, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops a lock we took
    return False


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _last_line(path: Path) -> dict | None:
    """The last JSON row of a metrics file, reading only its tail."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 65536))
            lines = f.read().decode("utf-8", "replace").strip().splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            return json.loads(line)
        except ValueError:
            continue
    return None


def _resume_command(command: str) -> str:
    args = shlex.split(command)
    if len(args) < 2 or args[:2] != ["posttrain", "run"]:
        return ""
    return shlex.join([a for a in args if a != "--resume"] + ["--resume"])


def run_info(run_dir: Path) -> RunInfo:
    h = holder(run_dir) or {}
    config = _json(run_dir / "config.json") or {}
    summary = _json(run_dir / "summary.json")
    said = _json(run_dir / STATUS_FILE) or {}
    last = _last_line(run_dir / "metrics.jsonl")
    latest = _json(run_dir / "checkpoints" / "latest.json") or {}
    kind = h.get("what") or ("posttrain run" if config.get("steps") is not None else "")
    if lock_held(run_dir):
        status = "running"
    elif summary is not None:
        status = "finished"
    elif said.get("status") == "failed":
        status = "failed"
    else:
        status = "killed"
    info = RunInfo(name=run_dir.name, path=str(run_dir), kind=kind, status=status,
                   step=(last or {}).get("step"), steps=config.get("steps"),
                   checkpoint_step=latest.get("step"), error=said.get("error", "") if status == "failed" else
                   ("interrupted" if status == "killed" and said.get("status") == "interrupted" else ""))
    if summary is not None:
        info.figures = {k: summary[k] for k in ("base_pass1", "final_pass1", "heldout_base_pass1",
                                                "heldout_final_pass1") if isinstance(summary.get(k), (int, float))}
    elif last and isinstance(last.get("reward_mean"), (int, float)):
        info.figures = {"reward_mean": last["reward_mean"]}
    stamps = [p.stat().st_mtime for p in (run_dir / "metrics.jsonl", run_dir / "summary.json",
                                          run_dir / LOCK_FILE) if p.exists()]
    info.updated = max(stamps, default=run_dir.stat().st_mtime)
    if status in ("failed", "killed") and kind == "posttrain run":
        info.resume = _resume_command(h.get("command", "")) or f"posttrain run --name {run_dir.name} --resume"
    return info


def list_runs(parent: str | os.PathLike = "runs") -> list[RunInfo]:
    """Every run directory directly under `parent` (one that has a lock, config or store), the
    most recently active first."""
    root = Path(parent)
    if not root.is_dir():
        return []
    found = [run_info(p) for p in root.iterdir()
             if p.is_dir() and any((p / f).exists() for f in (LOCK_FILE, "config.json", "store.sqlite"))]
    return sorted(found, key=lambda r: -r.updated)
