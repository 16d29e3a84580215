"""Verifier noise: re-verify stored outcomes k times, measure flips, quarantine noisy tasks.

    report = measure_noise(store, k=3)              # posttrain tasks noise RUN --k 3
    write_noise(run_dir, report)                    # RUN/noise.json (shown by `posttrain report`)
    update_quarantine(run_dir, report)              # RUN/quarantine.json
    load_quarantine(run_dir) -> set of task hashes  # what the training job leaves out

A stored trajectory *flips* when any of its k re-verifications (of the same stored answer and, for
workspace tasks, the same stored final workspace: `posttrain.rollout.replay.rescore`) disagrees
with its stored verdict (passed or score) or with another re-verification. A deterministic
verifier never flips. A re-verification that fails on infrastructure (sandbox died, verifier
crashed: an exception) is counted as `infra_errors`, never as a flip.

A task is noisy when the share of its checked trajectories that flipped exceeds `max_flip_rate`
(default 0: any flip). Quarantine only grows: a task once found noisy stays quarantined until
someone edits the file (a later lucky run that sees no flip does not clear it).

Re-verification is serial (one sandbox at a time): the store connection is not shared across
threads. Each re-verification is recorded in the store as a verdict of kind 'noise'.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from posttrain.values.verdict import Verdict

if TYPE_CHECKING:
    from posttrain.storage.store import Store

QUARANTINE_FILE = "quarantine.json"
QUARANTINE_FORMAT = "posttrain.quarantine/1"
NOISE_FILE = "noise.json"


@dataclass
class TaskNoise:
    hash: str
    key: str
    domain: str
    checks: int = 0
    flips: int = 0
    infra_errors: int = 0

    @property
    def flip_rate(self) -> float:
        return self.flips / self.checks if self.checks else 0.0


@dataclass
class NoiseReport:
    k: int
    max_flip_rate: float
    tasks: dict[str, TaskNoise] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def noisy(self) -> list[TaskNoise]:
        return [t for t in self.tasks.values() if t.checks and t.flip_rate > self.max_flip_rate]

    def by_domain(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for t in self.tasks.values():
            d = out.setdefault(t.domain, {"trajectories": 0, "flipped": 0, "infra_errors": 0,
                                          "tasks": 0, "noisy_tasks": 0})
            d["trajectories"] += t.checks
            d["flipped"] += t.flips
            d["infra_errors"] += t.infra_errors
            d["tasks"] += 1
            d["noisy_tasks"] += int(bool(t.checks) and t.flip_rate > self.max_flip_rate)
        for d in out.values():
            d["flip_rate"] = round(d["flipped"] / d["trajectories"], 6) if d["trajectories"] else None
        return dict(sorted(out.items()))

    def to_dict(self) -> dict[str, Any]:
        checks = sum(t.checks for t in self.tasks.values())
        flips = sum(t.flips for t in self.tasks.values())
        return {"k": self.k, "max_flip_rate": self.max_flip_rate, "trajectories": checks,
                "flipped": flips, "flip_rate": round(flips / checks, 6) if checks else None,
                "infra_errors": sum(t.infra_errors for t in self.tasks.values()),
                "domains": self.by_domain(), "seconds": round(self.seconds, 3),
                "noisy_tasks": [{"hash": t.hash, "key": t.key, "domain": t.domain, "checks": t.checks,
                                 "flips": t.flips} for t in self.noisy]}


def measure_noise(store: Store, *, k: int = 3, domains: str | None = None, run_id: str | None = None,
                  max_flip_rate: float = 0.0, sandbox_factory: Callable[[], Any] | None = None,
                  record: bool = True) -> NoiseReport:
    """Re-verify every scorable stored trajectory (optionally of `run_id` / matching `domains`
    globs) `k` times; see the module docstring."""
    import fnmatch

    from posttrain.rollout.replay import recorded_preload, rescore

    if k < 1:
        raise ValueError(f"noise check needs k >= 1, got {k}")
    if not 0 <= max_flip_rate < 1:
        raise ValueError(f"max_flip_rate must be in [0, 1), got {max_flip_rate}")
    patterns = [p.strip() for p in domains.split(",") if p.strip()] if domains else None
    started = time.perf_counter()
    report = NoiseReport(k=k, max_flip_rate=max_flip_rate)
    with ExitStack() as stack:
        pools = _lazy_pools(stack)
        for traj in store.trajectories(run_id=run_id):
            if traj.status == "infra_error" or traj.verdict is None:
                continue
            if patterns and not any(fnmatch.fnmatchcase(traj.domain, p) for p in patterns):
                continue
            entry = report.tasks.setdefault(traj.task_hash, TaskNoise(traj.task_hash, traj.task_key, traj.domain))
            outcomes = []
            for i in range(k):
                try:
                    factory = sandbox_factory or pools(recorded_preload(traj))
                    res = rescore(store, traj, sandbox_factory=factory, record=False)
                except Exception:  # noqa: BLE001 - infrastructure, counted, never a flip
                    entry.infra_errors += 1
                    continue
                new = res.verdict["rescored"]
                outcomes.append((new["passed"], new["score"]))
                if record:
                    store.put_verdict(traj.id, Verdict(passed=new["passed"], score=new["score"],
                                                       details={"noise_check": i + 1, "of": k},
                                                       verifier_version=new["version"]), "noise")
            if not outcomes:
                continue
            entry.checks += 1
            stored = (traj.verdict.passed, traj.verdict.score)
            entry.flips += int(any(o != stored for o in outcomes))
    report.seconds = time.perf_counter() - started
    return report


def _lazy_pools(stack: ExitStack) -> Callable[[tuple[str, ...]], Callable[[], Any]]:
    """preload -> a sandbox factory that starts a one-sandbox pool with that preload (a domain's:
    module files its verifier runs among them) on first use (most verifiers need none)."""
    pools: dict[tuple[str, ...], Any] = {}

    def for_preload(preload: tuple[str, ...]) -> Callable[[], Any]:
        def factory() -> Any:
            if preload not in pools:
                from posttrain.sandbox import SandboxPool

                pools[preload] = stack.enter_context(SandboxPool(size=1, preload=preload))
            return pools[preload].sandbox()
        return factory
    return for_preload


def _write_json(path: Path, body: Any) -> Path:
    from posttrain.errors import write_text_atomic

    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(body, indent=1), "the verifier-noise check")
    return path


def write_noise(run_dir: str | Path, report: NoiseReport) -> Path:
    return _write_json(Path(run_dir) / NOISE_FILE, {"measured_at": time.time(), **report.to_dict()})


def _read_quarantine(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not JSON ({e}); fix or delete the quarantine file") from None
    if not isinstance(data, dict) or data.get("format") != QUARANTINE_FORMAT or not isinstance(data.get("tasks"), dict):
        raise ValueError(f"{path}: expected {{'format': {QUARANTINE_FORMAT!r}, 'tasks': {{hash: ...}}}}")
    return data["tasks"]


def update_quarantine(run_dir: str | Path, report: NoiseReport) -> Path:
    """Add the report's noisy tasks to `RUN/quarantine.json` (existing entries are kept)."""
    path = Path(run_dir) / QUARANTINE_FILE
    tasks = _read_quarantine(path)
    now = time.time()
    for t in report.noisy:
        tasks[t.hash] = {"key": t.key, "domain": t.domain, "flips": t.flips, "checks": t.checks,
                         "reason": f"verifier flipped on {t.flips}/{t.checks} re-verified trajectories "
                                   f"(k={report.k})",
                         "quarantined_at": tasks.get(t.hash, {}).get("quarantined_at", now)}
    return _write_json(path, {"format": QUARANTINE_FORMAT, "updated_at": now, "tasks": tasks})


def load_quarantine(run_dir: str | Path) -> set[str]:
    """Hashes of the tasks quarantined in `RUN/quarantine.json` (empty when there is none)."""
    return set(_read_quarantine(Path(run_dir) / QUARANTINE_FILE))
