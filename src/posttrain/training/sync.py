"""Publishing a trainer's weights to inference servers: the `reload` sync method.

    sync = WeightSync(policy.roots, run_dir / "weights")
    seconds = sync.publish(trainer.model, trainer.version)   # after every trainer step

One `publish`:

1. the weights are written **untied** (the output head as its own tensor) as safetensors into
   `<directory>/current`, **atomically** (`posttrain.policies.server.weights.write_weights`): a
   server reads the old directory or the new one, never half of one;
2. on every server, vLLM's dev-mode sequence (`VLLM_SERVER_DEV_MODE=1`; posttrain's own server
   has the same routes): `POST /pause?mode=keep` (in-flight requests are frozen, not dropped),
   `POST /collective_rpc {"method": "reload_weights", "kwargs": {"weights_path": DIR}}`,
   `POST /reset_prefix_cache` (a reload does not invalidate vLLM's prefix cache: stale keys and
   values produced wrong tokens until it was reset), `POST /resume`. Servers are updated in
   parallel;
3. the caller then marks the new version as served (`ServedPolicy.set_version`) before any new
   episode starts, so every trajectory records weights it was really generated with.

A server that fails any of these raises `SyncError` naming the server and the call: training
stops rather than silently sampling from weights it believes are updated. Other methods (NCCL
broadcast on GPUs) plug in as other classes with the same `publish`.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from posttrain.policies.server.weights import untied_state_dict, write_weights
from posttrain.training.publish import VersionListener, VersionMismatch

SYNC_METHODS = ("reload",)


class SyncError(RuntimeError):
    """A server did not take the new weights (infrastructure): names the server and the call."""


def _post(url: str, body: dict[str, Any] | None, timeout: float) -> dict[str, Any]:
    data = json.dumps(body).encode() if body is not None else b""
    request = urllib.request.Request(url, data=data, method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            raw = r.read()
    except urllib.error.HTTPError as e:
        raise SyncError(f"{url}: HTTP {e.code}: {e.read()[:500].decode(errors='replace')}") from None
    except (urllib.error.URLError, OSError) as e:
        raise SyncError(f"{url}: {type(e).__name__}: {e}") from None
    try:
        return json.loads(raw) if raw else {}
    except ValueError:
        return {}


class WeightSync:
    """The `reload` method over HTTP (see the module docstring)."""

    def __init__(self, roots: Sequence[str], directory: str | os.PathLike, *,
                 method: str = "reload", timeout_s: float = 300.0) -> None:
        if method not in SYNC_METHODS:
            raise ValueError(f"rollout.sync {method!r}: expected one of {SYNC_METHODS}")
        if not roots:
            raise ValueError("WeightSync needs at least one server")
        self.roots = [r.rstrip("/") for r in roots]
        self.directory = Path(directory).resolve()
        self.method, self.timeout_s = method, timeout_s
        self.times: list[float] = []
        """seconds of each publish (write + every server's pause/reload/reset/resume)"""
        self.write_times: list[float] = []

    @property
    def weights_path(self) -> Path:
        return self.directory / "current"

    def publish(self, model: torch.nn.Module, version: Any = None) -> float:
        t0 = time.perf_counter()
        meta = {"version": getattr(version, "name", version)} if version is not None else None
        write_weights(untied_state_dict(model), self.weights_path, meta=meta)
        self.write_times.append(time.perf_counter() - t0)
        if len(self.roots) == 1:
            self._update(self.roots[0])
        else:
            with ThreadPoolExecutor(len(self.roots)) as pool:
                list(pool.map(self._update, self.roots))
        seconds = time.perf_counter() - t0
        self.times.append(seconds)
        return seconds

    def _update(self, root: str) -> None:
        t = self.timeout_s
        _post(f"{root}/pause?mode=keep", None, t)
        try:
            _post(f"{root}/collective_rpc", {"method": "reload_weights",
                                             "kwargs": {"weights_path": str(self.weights_path)}}, t)
            _post(f"{root}/reset_prefix_cache", None, t)
        finally:
            _post(f"{root}/resume", None, t)  # never leave a server paused


class ServerPublisher:
    """The training loop's sampler when generation runs on servers: a `ServedPolicy` kept at the
    trainer's weights by a `WeightSync` (the server-side twin of `publish.PolicyPublisher`, with
    the same `subscribe`/`publish` contract).

    `publish()` (after each trainer step) updates every server, then marks the new version
    served, then announces it to the listeners (the scheduler), so an episode admitted afterwards
    records weights the servers really have. `record` writes onto
    each finished trajectory the version its first request was sent under, and `filter_stale`
    enforces the staleness bound on those recorded versions: a group holding a sample older than
    the bound is never trained on (`stale_dropped`); `stale_trained` counts samples trained on
    beyond it, which the filter keeps at 0."""

    def __init__(self, trainer: Any, served: Any, sync: WeightSync) -> None:
        self.trainer, self.served, self.weights = trainer, served, sync
        self.step_of: dict[str, int] = {}
        """version name -> the trainer step that produced it"""
        self.version_mismatches = 0
        """trajectories whose admission version differed from the version actually served"""
        self.stale_dropped = 0
        self.stale_trained = 0
        self._listeners: list[VersionListener] = []
        self._push()

    @property
    def version(self) -> Any:
        return self.served.version

    @property
    def max_positions(self) -> int | None:
        return self.served.max_positions

    def render(self, request: Any) -> list[int] | None:
        return self.served.render(request)

    def generate(self, requests: Sequence[Any]) -> list[Any]:
        return self.served.generate(requests)

    def subscribe(self, listener: VersionListener) -> None:
        """`listener(name)` is called by every `publish()` (e.g. `Scheduler.set_policy_version`)."""
        self._listeners.append(listener)

    def _push(self) -> Any:
        version = self.trainer.version
        self.weights.publish(self.trainer.model, version)
        self.step_of[version.name] = self.trainer.step_count
        self.served.set_version(version)
        return version

    def publish(self) -> Any:
        """Put the trainer's current weights on every server, then announce the version."""
        version = self._push()
        for listener in self._listeners:
            number = listener(version.name)
            if number != self.trainer.step_count:
                raise VersionMismatch(f"{version.name}: a listener numbers it {number}, the trainer "
                                      f"is at step {self.trainer.step_count}")
        return version

    def record(self, trajectories: Sequence[Any]) -> None:
        """Set each trajectory's `policy_version` to the version its episode was served under."""
        for t in trajectories:
            served = self.served.first_version.get(t.id)
            if served is None:
                continue  # no request reached a server (an episode that failed before its first turn)
            if served != t.policy_version:
                self.version_mismatches += 1
            t.policy_version = served

    def _step(self, name: str) -> int:
        if name in self.step_of:
            return self.step_of[name]
        tail = name.rsplit("/step-", 1)  # a version from before a resume: '<run>/step-<n>'
        return int(tail[1]) if len(tail) == 2 and tail[1].isdigit() else 0

    def filter_stale(self, groups: Sequence[Any], max_staleness: int) -> tuple[list[Any], dict[str, float]]:
        """The groups that may be trained on at the trainer's current step, and the counts."""
        step = self.trainer.step_count
        kept, worst = [], 0
        for g in groups:
            lags = [step - self._step(t.policy_version) for t in g.trajectories]
            for t in g.trajectories:
                self.served.pop_first_version(t.id)
            lag = max(lags, default=0)
            if lag > max_staleness:
                self.stale_dropped += len(g.trajectories)
                continue
            worst = max(worst, lag)
            self.stale_trained += sum(1 for x in lags if x > max_staleness)
            kept.append(g)
        return kept, {"served_staleness_max": worst, "stale_dropped": self.stale_dropped,
                      "stale_trained": self.stale_trained, "version_mismatches": self.version_mismatches,
                      "sync_s": self.weights.times[-1] if self.weights.times else 0.0}
