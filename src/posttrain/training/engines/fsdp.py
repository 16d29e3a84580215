"""The FSDP2 engine: PyTorch's `fully_shard` over one process per device, started by `torchrun`.

    torchrun --nproc-per-node 2 -m posttrain.cli run my.toml      # [trainer] engine = "fsdp"

Every decoder block is its own FSDP unit and the root module holds the rest (embeddings, the
final norm, the output head -- a tied head stays with its embedding), so each process keeps
1/world of every parameter, gradient and optimizer state, and gathers a block's weights only
while that block computes. Data parallel on top: a step's samples are split into `world`
contiguous parts, one per process.

What makes the result equal the single-process engine's (checked by `benchmarks/engines.py`):

* the token weights of the loss are computed over the *whole* step's batch before the split, so
  a process's loss is exactly its share of the single-process loss; FSDP averages gradients over
  processes, so `backward` scales each share by `world` to turn that average back into the sum;
* every process runs the same number of forwards (FSDP's collectives pair up): a process with
  fewer samples runs a placeholder forward whose loss is multiplied by zero;
* metrics (loss, KL, clip fraction, ...) are sums over processes; no-grad log-probs are computed
  by each process for its own samples and summed into one full vector on every process;
* gradient clipping uses the global norm over the sharded gradients.

Rank 0 also keeps `full_model`, an unsharded copy of the weights made before sharding and
refreshed by `refresh()` after every update (a full-state-dict gather that every rank joins):
what a sampler in this process generates with, what versions are hashed from and what a
checkpoint's weights are written from. It costs one more copy of the weights on rank 0; the
optimizer state, the largest part, stays sharded.

Backend: gloo on CPU (what the tests run); on a machine with CUDA, NCCL for CUDA tensors and gloo
for CPU ones (objects broadcast between ranks travel through gloo).
"""

from __future__ import annotations

import copy
import os
from collections.abc import Sequence
from typing import Any, cast

import torch
import torch.distributed as dist

from posttrain.training.batch import sequence_logprobs
from posttrain.training.engines.base import checkpointing, precision, prepare, sample_tokens, skip_nonfinite, split


def _blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The decoder blocks: the children of the model's largest ModuleList."""
    lists: list[torch.nn.ModuleList] = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList)]
    if not lists:
        return []
    return list(max(lists, key=lambda ml: len(list(ml))))


def init_distributed(device: str) -> tuple[int, int]:
    """Join the process group `torchrun` describes (idempotent); returns (rank, world)."""
    if not dist.is_initialized():
        if "RANK" not in os.environ:
            raise RuntimeError("TrainerConfig.engine = 'fsdp' runs under torchrun "
                               "(e.g. `torchrun --nproc-per-node 2 -m posttrain.cli run ...`); "
                               "RANK/WORLD_SIZE are not set")
        if torch.cuda.is_available():  # this process's own GPU, before any NCCL call
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
            dist.init_process_group("cpu:gloo,cuda:nccl")
        else:
            dist.init_process_group("gloo")
    return dist.get_rank(), dist.get_world_size()


def shard(model: torch.nn.Module) -> torch.nn.Module:
    from torch.distributed.fsdp import fully_shard

    for block in _blocks(model):
        fully_shard(block)
    fully_shard(model)
    return model


class FSDPEngine:
    def __init__(self, model: Any, config: Any, reference: torch.nn.Module | None = None) -> None:
        self.rank, self.world = init_distributed(config.device)
        self.precision = getattr(config, "precision", "fp32")
        self.share_prompts = not checkpointing(config)
        prepare(model, config)
        self._embedding_name = _param_name(model, model.get_input_embeddings().weight)
        head = model.get_output_embeddings()
        self._tied = head is not None and head.weight is model.get_input_embeddings().weight
        self.full_model: torch.nn.Module | None = copy.deepcopy(model).eval() if self.rank == 0 else None
        """rank 0: the unsharded weights, kept equal to the trained ones by `refresh`; else None"""
        self.model = shard(model)
        self.reference = shard(reference) if reference is not None else None
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=config.lr, betas=config.betas,
                                           weight_decay=config.weight_decay)

    def micro_batches(self, lengths: Sequence[int], size: int, tokens: int = 0) -> list[tuple[int, int]]:
        n = len(lengths)
        parts = [(r * n // self.world, (r + 1) * n // self.world) for r in range(self.world)]
        splits = [split(lengths, lo, hi, size, tokens) for lo, hi in parts]
        k = max(1, max(map(len, splits)))
        mine, end = splits[self.rank], parts[self.rank][1]
        return mine + [(end, end)] * (k - len(mine))  # placeholders: as many forwards as the others

    def forward(self, samples: Sequence[Any], *, temperature: float,
                with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        with precision(self.model, self.precision):
            return sequence_logprobs(self.model, samples, temperature=temperature, with_entropy=with_entropy,
                                     share_prompts=self.share_prompts)

    def backward(self, loss: torch.Tensor) -> None:
        (loss * self.world).backward()  # FSDP averages gradients over processes: undo it

    def reduce(self, sums: dict[str, float], how: str = "sum") -> dict[str, float]:
        keys = sorted(sums)
        t = torch.tensor([float(sums[k]) for k in keys], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX if how == "max" else dist.ReduceOp.SUM)
        return dict(zip(keys, t.tolist()))

    def optimizer_step(self, max_grad_norm: float) -> float:
        limit = max_grad_norm if max_grad_norm > 0 else float("inf")
        total = torch.nn.utils.clip_grad_norm_(self.model.parameters(), limit)
        norm = float(total.full_tensor() if hasattr(total, "full_tensor") else total)
        if skip_nonfinite(norm, self.optimizer):  # the global norm: every rank skips alike
            return norm
        self.optimizer.step()
        return norm

    @torch.no_grad()
    def logprobs(self, model: torch.nn.Module, samples: Sequence[Any], *, temperature: float,
                 size: int, tokens: int = 0) -> torch.Tensor:
        offsets = [0]
        for s in samples:
            offsets.append(offsets[-1] + len(s.completion_ids))
        out = torch.zeros(offsets[-1], dtype=torch.float32)
        was_training = model.training
        model.eval()
        try:
            for lo, hi in self.micro_batches(sample_tokens(samples), size, tokens):
                with precision(model, self.precision):
                    if lo == hi:  # the placeholder forward: this process has run out of samples
                        sequence_logprobs(model, samples[:1], temperature=temperature)
                        continue
                    lp = sequence_logprobs(model, samples[lo:hi], temperature=temperature)[0]
                out[offsets[lo]:offsets[hi]] = lp.float().cpu()
        finally:
            model.train(was_training)
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
        return out.to(next(model.parameters()).device)

    def refresh(self) -> None:
        """Copy the updated weights into rank 0's `full_model` (every rank must call it)."""
        state = _full_state(self.model)
        if self.full_model is not None:
            self.full_model.load_state_dict(state)

    def reference_weights(self) -> dict[str, torch.Tensor]:
        """The reference model's full state dict on rank 0, {} elsewhere (every rank calls it)."""
        if self.reference is None:
            return {}
        state = _full_state(self.reference)
        return state if self.rank == 0 else {}

    def optimizer_state(self) -> dict[str, Any]:
        """The full optimizer state, keyed by parameter name, on rank 0 ({} elsewhere; every
        rank calls it): a checkpoint independent of how many processes wrote it."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        state = get_optimizer_state_dict(self.model, self.optimizer, options=StateDictOptions(
            full_state_dict=True, cpu_offload=True))
        return cast(dict[str, Any], state) if self.rank == 0 else {}

    def load_optimizer_state(self, state: dict[str, Any]) -> None:
        """Every rank loads the full state (`optimizer_state`'s) and keeps its shard."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        if any(not isinstance(k, str) for k in state.get("state", {})):
            raise ValueError("the checkpoint's optimizer state is the local engine's (numbered "
                             "parameters): resume it with [trainer] engine = 'local'")
        set_optimizer_state_dict(self.model, self.optimizer, optim_state_dict=state,
                                 options=StateDictOptions(full_state_dict=True))

    def export_weights(self) -> dict[str, torch.Tensor]:
        """The full, untied state dict on rank 0 (every process must call it; others get {})."""
        full = _full_state(self.model)
        if self.rank != 0:
            return {}
        out: dict[str, torch.Tensor] = {}
        seen: set[int] = set()
        for name, value in full.items():
            t = value.detach().to("cpu")
            if t.data_ptr() in seen:
                t = t.clone()
            seen.add(t.data_ptr())
            out[name] = t.contiguous()
        if self._tied and "lm_head.weight" not in out and self._embedding_name in out:
            out["lm_head.weight"] = out[self._embedding_name].clone()
        return out


def _full_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The unsharded state dict on the CPU, on rank 0 ({} elsewhere; every rank calls it)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return cast(dict[str, torch.Tensor], get_model_state_dict(
        model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)))


def _param_name(model: torch.nn.Module, param: torch.Tensor) -> str:
    for name, p in model.named_parameters(remove_duplicate=False):
        if p is param:
            return name
    return ""
