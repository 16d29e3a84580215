"""A non-zero rank of `posttrain run` under torchrun: build the trainer rank 0 builds, then make
the collective calls rank 0 orders (`posttrain.training.engines.ranks` describes the orders)."""

from __future__ import annotations

import torch.distributed as dist

from posttrain.training.engines import ranks
from posttrain.training.engines.fsdp import init_distributed
from posttrain.training.trainer import Trainer


def follow() -> None:
    """A non-zero rank's whole life: build the trainer rank 0 builds, then obey until "stop"."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # rank 0 says what is happening; this rank only errors
    hf_logging.set_verbosity_error()
    init_distributed("cpu")
    trainer: Trainer | None = None
    while True:
        order = ranks.receive()
        kind = order[0]
        if kind == "stop":
            break
        if kind == "init":
            _, source, config, resume = order
            trainer = Trainer.resume(source, config) if resume else Trainer(source, config)
        elif trainer is None:
            raise RuntimeError(f"rank 0 sent {kind!r} before 'init'")
        elif kind == "step":
            trainer.step(order[1])
        elif kind == "save":
            trainer.save(order[1])
        else:
            raise RuntimeError(f"unknown order from rank 0: {kind!r}")
    dist.destroy_process_group()
