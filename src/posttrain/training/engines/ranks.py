"""`posttrain run` under `torchrun`: rank 0 runs the job, the other ranks follow its trainer.

    torchrun --nproc-per-node 2 -m posttrain.cli run my.toml      # [trainer] engine = "fsdp"

Rank 0 does everything a single process does: it evaluates, runs the scheduler and its episodes
(generation with rank 0's full copy of the weights, or on inference servers), writes the store,
`metrics.jsonl`, the checkpoints and the logs. The other ranks hold nothing but their shard of
the trainer and print nothing but errors: they wait for rank 0's orders and make the same
collective calls. Every order is one `broadcast_object_list` from rank 0:

    ("init", source, config, resume)   build the trainer: `Trainer(source, config)`, or
                                       `Trainer.resume(source)` (every rank reads the checkpoint)
    ("step", groups)                   `Trainer.step(groups)`: each rank computes its slice of the
                                       batch every rank derives from the same groups
    ("save", directory)                `Trainer.save`: gather the full optimizer state (rank 0 writes)
    ("stop",)                          training is over: leave

Why groups rather than tensors: every rank turns them into the same samples and advantages with
the same deterministic code, so the batch needs no second encoding; they are a few kilobytes.
The followers' loop is `posttrain.training.follow`. A rank that fails ends its process and
`torchrun` ends the others, so no rank waits forever.
"""

from __future__ import annotations

import os
from typing import Any

import torch.distributed as dist


def rank_and_world() -> tuple[int, int]:
    """This process's rank and the number of processes, as `torchrun` set them ((0, 1) outside)."""
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def is_follower() -> bool:
    """Whether this process is a non-zero rank of a `torchrun` launch."""
    rank, world = rank_and_world()
    return world > 1 and rank != 0


def announce(*order: Any) -> None:
    """Rank 0: tell the followers what to do next (they then make the same collective calls).
    Outside torchrun, a no-op."""
    _, world = rank_and_world()
    if world <= 1:
        return
    from posttrain.training.engines.fsdp import init_distributed

    init_distributed("cpu")
    dist.broadcast_object_list([order], src=0)


def receive() -> tuple[Any, ...]:
    """A follower: the next order from rank 0 (blocks until it comes)."""
    box: list[Any] = [None]
    dist.broadcast_object_list(box, src=0)
    return tuple(box[0])


def finish() -> None:
    """Rank 0, once training is over: release the followers and leave the process group."""
    _, world = rank_and_world()
    if world > 1 and dist.is_initialized():
        announce("stop")
        dist.destroy_process_group()
