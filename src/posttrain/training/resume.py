"""A run's checkpoints and how a run resumes from them exactly.

    ckpts = RunCheckpoints(run_dir / "checkpoints", keep=3)
    ckpts.clean_interrupted()                 # .step-N.tmp-* / .old-* left by a kill mid-save
    trainer = ckpts.resume() or Trainer(...)  # weights, optimizer, RNG, step, scheduler state
    ...
    ckpts.save(trainer, scheduler_state)      # step-N (atomic), then latest.json, then prune

What makes a resume exact (the same per-step rewards, figures and weights as a run that was never
interrupted, with deterministic kernels): a checkpoint holds the weights, the optimizer, the
python/numpy/torch RNG states, the trainer's counters and the scheduler's state (its data cursor
per domain, fair-share and adaptive-sampling state, and the groups in flight with the policy
version each was admitted under). Episodes are seeded by identity (group, member, attempt), so a
group in flight at the save is re-generated identically; a group that completed after the save is
reloaded from the store instead. What a resume cannot restore is wall-clock timing: with a
staleness bound above 0 which samples overlap which update depends on timing in any run, so only
synchronous runs (`max_staleness = 0`, the default) are exact.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from posttrain.training.trainer import Trainer

LATEST = "latest.json"


class RunCheckpoints:
    def __init__(self, directory: str | os.PathLike, keep: int) -> None:
        self.directory = Path(directory)
        self.keep = keep

    def latest(self) -> dict[str, Any] | None:
        """{'path', 'step', 'version'} of the newest complete checkpoint, or None."""
        path = self.directory / LATEST
        return json.loads(path.read_text()) if path.exists() else None

    def clean_interrupted(self) -> list[Path]:
        """Remove what a save killed midway left: `.step-N.tmp-*` (never renamed into place) and
        `.step-N.old-*` (an overwritten checkpoint swapped aside). Neither is ever read."""
        if not self.directory.is_dir():
            return []
        left = [p for p in self.directory.iterdir() if p.name.startswith(".step-")
                and (".tmp-" in p.name or ".old-" in p.name)]
        for p in left:
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
        return left

    def resume(self) -> Trainer | None:
        """The trainer of the latest checkpoint (weights, optimizer, RNG, counters), or None."""
        latest = self.latest()
        return None if latest is None else Trainer.resume(latest["path"], None)

    def save(self, trainer: Trainer, scheduler_state: Mapping[str, Any]) -> Path:
        """`step-N` atomically, then `latest.json` pointing at it, then pruning: a kill anywhere
        in here leaves the previous checkpoint usable."""
        path = self.directory / f"step-{trainer.step_count}"
        trainer.save(path, extra={"scheduler": dict(scheduler_state)})
        tmp = self.directory / (LATEST + ".tmp")
        tmp.write_text(json.dumps({"path": str(path), "step": trainer.step_count,
                                   "version": trainer.version.name}, indent=2) + "\n")
        os.replace(tmp, self.directory / LATEST)
        self.prune()
        return path

    def prune(self) -> list[Path]:
        """Delete all but the newest `keep` step-N directories (after `latest.json` points at the
        new one, so a crash in here loses nothing that resuming needs)."""
        if not self.directory.is_dir():
            return []
        ckpts = sorted((p for p in self.directory.glob("step-*") if p.is_dir() and p.name[5:].isdigit()),
                       key=lambda p: int(p.name[5:]))
        old = ckpts[:-self.keep]
        for p in old:
            shutil.rmtree(p, ignore_errors=True)
        return old


def advance_recorded_failures(state: Mapping[str, Any],
                              infra_attempts: Mapping[tuple[str, int], int]) -> dict[str, Any]:
    """The scheduler state to resume from, given the attempts the store recorded as infra_error
    after the save ((group, member) -> highest such attempt): such a member goes on at its next
    attempt with one retry more, as the interrupted run did. Without this a re-run of that attempt would
    collide with the stored failure under the same identity."""
    out = copy.deepcopy(dict(state))
    for g in out.get("groups", []):
        for m in range(int(g["size"])):
            failed = infra_attempts.get((g["gid"], m))
            if failed is None or failed < int(g["attempts"][m]):
                continue
            bump = failed + 1 - int(g["attempts"][m])
            g["attempts"][m] = failed + 1
            g["retries"][m] = int(g["retries"][m]) + bump
            g["launched"][m] = False
    return out
