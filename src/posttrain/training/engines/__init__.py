"""Trainer engines: where a step's forward/backward and optimizer update run.

`local` (one process, the default) and `fsdp` (PyTorch FSDP2 `fully_shard`, one process per
device under `torchrun`); `make_engine` picks by `TrainerConfig.engine`. The contract is
`posttrain.training.engines.base.TrainEngine`.
"""

from typing import Any

import torch

from posttrain.training.engines.base import ENGINES, TrainEngine

__all__ = ["ENGINES", "TrainEngine", "make_engine"]


def make_engine(model: torch.nn.Module, config: Any, reference: torch.nn.Module | None = None) -> Any:
    """The backend `config.engine` names, around `model` (and the frozen reference, if any)."""
    name = getattr(config, "engine", "local")
    if name == "local":
        from posttrain.training.engines.local import LocalEngine

        return LocalEngine(model, config, reference)
    if name == "fsdp":
        from posttrain.training.engines.fsdp import FSDPEngine

        return FSDPEngine(model, config, reference)
    raise ValueError(f"TrainerConfig.engine must be one of {ENGINES}, got {name!r}")
