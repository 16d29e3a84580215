"""One class per tracker library. Each imports its library in its constructor, so a run that does
not name it never imports it (W&B and MLflow take seconds to import)."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from posttrain.tracking import TrackingError
from posttrain.tracking.config import LoggingConfig


def _require(module: str, extra: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise TrackingError(f"[logging] backends names {extra!r}, but {module!r} is not installed "
                            f"({e}); pip install {extra}") from None


class TensorBoard:
    """Event files in `<run>/tensorboard`, through torch's TensorBoard `FileWriter` (the writer
    under `SummaryWriter`; it writes from a background thread). A step's scalars go out as one
    event holding every value, built with TensorBoard's own `Summary` protobuf: per-scalar
    `add_scalar` calls cost ~0.3 ms each, which for the ~200 figures of a checkpoint step was 4% of
    a tiny-model update (benchmarks/tracking.py)."""

    def __init__(self, config: LoggingConfig, run_dir: Path, run_name: str, params: dict) -> None:
        _require("tensorboard", "tensorboard")
        from tensorboard.compat.proto.summary_pb2 import Summary
        from torch.utils.tensorboard.writer import FileWriter

        self.dir = run_dir / "tensorboard"
        self.writer = FileWriter(str(self.dir))
        self._summary = Summary

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        values = [self._summary.Value(tag=k, simple_value=float(v)) for k, v in scalars.items()]
        self.writer.add_summary(self._summary(value=values), global_step=step, walltime=time.time())

    def close(self) -> None:
        self.writer.close()


class Wandb:
    """A W&B run in `<run>/wandb`, offline by default (`wandb sync` uploads it later)."""

    def __init__(self, config: LoggingConfig, run_dir: Path, run_name: str, params: dict) -> None:
        wandb = _require("wandb", "wandb")
        run_dir.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(project=config.project, name=run_name, dir=str(run_dir),
                              mode=config.wandb_mode, config=params,
                              settings=wandb.Settings(console="off", silent=True))

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        self.run.log(dict(scalars), step=step)

    def close(self) -> None:
        self.run.finish()


_MLFLOW_BAD = re.compile(r"[^A-Za-z0-9_\-. :/]")


class Mlflow:
    """An MLflow run through `MlflowClient` (no global active run), in a local file store
    (`<run>/mlruns`) unless `mlflow_uri` names another store or a tracking server. Metric names lose the characters
    MLflow refuses ('pass@1' -> 'pass_1')."""

    def __init__(self, config: LoggingConfig, run_dir: Path, run_name: str, params: dict) -> None:
        _require("mlflow", "mlflow")
        from mlflow.tracking import MlflowClient

        self.uri = config.mlflow_uri or (run_dir / "mlruns").resolve().as_uri()
        if self.uri.startswith("file:"):
            # MLflow 3 keeps file stores in maintenance mode behind this switch; a file store needs
            # no database packages (`mlflow_uri = "sqlite:///PATH"` for MLflow's database store)
            import os

            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = MlflowClient(tracking_uri=self.uri)
        exp = self.client.get_experiment_by_name(config.project)
        exp_id = exp.experiment_id if exp else self.client.create_experiment(config.project)
        self.run_id = self.client.create_run(exp_id, run_name=run_name).info.run_id
        self._pending: list[Any] = []
        flat = {k: str(v)[:500] for k, v in _flat_params(params).items()}
        for key, value in list(flat.items())[:100]:
            self.client.log_param(self.run_id, _MLFLOW_BAD.sub("_", key), value)

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        ms = int(time.time() * 1000)
        metrics = [Metric(_MLFLOW_BAD.sub("_", k), float(v), ms, step) for k, v in scalars.items()]
        for i in range(0, len(metrics), 1000):  # MLflow's batch limit
            # MLflow's own background queue: a file store writes one file per metric (~70 ms for
            # a checkpoint step's ~200 figures), which would otherwise hold up the training loop
            self._pending.append(self.client.log_batch(self.run_id, metrics=metrics[i:i + 1000],
                                                       synchronous=False))

    def close(self) -> None:
        for op in self._pending:
            op.wait()
        self._pending.clear()
        self.client.set_terminated(self.run_id)


class Trackio:
    """A trackio run (its local store; trackio's dashboard shows it)."""

    def __init__(self, config: LoggingConfig, run_dir: Path, run_name: str, params: dict) -> None:
        self.trackio = _require("trackio", "trackio")
        self.run = self.trackio.init(project=config.project, name=run_name, config=params)

    def log(self, step: int, scalars: Mapping[str, float]) -> None:
        self.trackio.log(dict(scalars), step=step)

    def close(self) -> None:
        self.trackio.finish()


def _flat_params(params: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in params.items():
        if isinstance(v, Mapping):
            out.update(_flat_params(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


OPENERS: dict[str, Callable[[LoggingConfig, Path, str, dict], Any]] = {
    "tensorboard": TensorBoard, "wandb": Wandb, "mlflow": Mlflow, "trackio": Trackio}
