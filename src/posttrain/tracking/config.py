"""`[logging]` in a run config: where the job's scalars go besides `metrics.jsonl`.

    [logging]
    backends = ["tensorboard", "wandb"]   # default ["tensorboard"]; [] turns tracking off
    project = "my-project"                # W&B / MLflow / trackio project (experiment) name
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

Backend = Literal["tensorboard", "wandb", "mlflow", "trackio"]


class LoggingConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    backends: list[Backend] = Field(default_factory=lambda: list[Backend](["tensorboard"]))
    """experiment trackers that receive every scalar: TensorBoard event files in `<run>/tensorboard`
    (the default), W&B, MLflow, trackio; each through its own library, imported only when named"""
    project: str = Field("posttrain", min_length=1)
    """project (W&B, trackio) or experiment (MLflow) name; the run is named after the posttrain run"""
    wandb_mode: Literal["offline", "online"] = "offline"
    """W&B without a network by default (files in `<run>/wandb`; `wandb sync` uploads them later)"""
    mlflow_uri: str = ""
    """MLflow tracking URI; empty = a local file store in `<run>/mlruns`"""
