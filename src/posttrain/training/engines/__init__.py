"""Trainer engines: where a step's forward/backward and optimizer update run.

`local` (one process, the default) and `fsdp` (PyTorch FSDP2 `fully_shard`, one process per
device under `torchrun`); `make_engine` picks by `TrainerConfig.engine`. The contract is
`posttrain.training.engines.base.TrainEngine`.
"""

from posttrain.training.engines.base import ENGINES, TrainEngine, make_engine

__all__ = ["ENGINES", "TrainEngine", "make_engine"]
