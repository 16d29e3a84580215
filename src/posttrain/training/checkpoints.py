"""Atomic trainer checkpoints that a resumed run continues from exactly.

A checkpoint directory holds:

    config.json, model.safetensors,       the weights, in Hugging Face format: the directory
    tokenizer files                       loads as a `TorchPolicy` (a new round can start here)
    policy_version.json                   name and parent of these weights (lineage)
    optimizer.pt                          AdamW state
    rng.pt                                python, numpy, torch (and CUDA) RNG states
    trainer_state.json                    step, data cursor, config, start version, totals, extra
    reference/                            the KL reference weights (only when kl_beta > 0)

With LoRA (`TrainerConfig.lora`) the weights are the adapters alone, `adapter_model.safetensors`
and `adapter_config.json` (peft's format), and `trainer_state.json` names the base model's
directory (`lora_base`), which the reference then is too (no `reference/`).

Everything is written to a temporary sibling directory first and renamed into place, so a
crash mid-save leaves either the previous checkpoint or none -- never a half-written one.
Overwriting an existing directory swaps it aside first; there is a moment where the name does
not exist, but no moment where it holds a mix of two checkpoints.

`extra` is the caller's opaque state (the scheduler's queues, say); it must be JSON-serialisable.
`.pt` files hold only tensors and plain values and load with `weights_only=True`.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import torch

from posttrain.errors import is_disk_full, no_space

STATE_FILE = "trainer_state.json"
FORMAT = 1


def rng_state() -> dict[str, Any]:
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": (kind, torch.from_numpy(np.asarray(keys, dtype=np.int64)), pos, has_gauss, cached),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _fsync_tree(root: Path) -> None:
    for path in root.rglob("*"):
        if path.is_file():
            with open(path, "rb") as f:
                os.fsync(f.fileno())


def write_atomic(directory: str | os.PathLike, write: Any) -> Path:
    """Call `write(tmp_dir)` then move tmp_dir to `directory` in one rename."""
    final = Path(directory)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".{final.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        write(tmp)
        _fsync_tree(tmp)
        if final.exists():
            aside = final.parent / f".{final.name}.old-{uuid.uuid4().hex[:8]}"
            os.rename(final, aside)
            os.rename(tmp, final)
            shutil.rmtree(aside, ignore_errors=True)
        else:
            os.rename(tmp, final)
    except BaseException as e:
        # torch says "enforce fail at inline_container.cc" when the disk is full: say it plainly
        full = isinstance(e, Exception) and is_disk_full(e, tmp)
        shutil.rmtree(tmp, ignore_errors=True)
        if full:
            raise no_space(final, "writing a checkpoint") from e
        raise
    return final


def save_state(tmp: Path, *, optimizer: dict[str, Any], state: dict[str, Any]) -> None:
    """The non-weight files of a checkpoint (weights are saved by the caller); `optimizer` is
    the optimizer's state dict (the engine's `optimizer_state()`)."""
    try:
        text = json.dumps({"format": FORMAT, **state}, indent=1, sort_keys=True)
    except TypeError as e:
        raise ValueError(f"checkpoint state (extra included) must be JSON-serialisable: {e}") from e
    torch.save(optimizer, tmp / "optimizer.pt")
    torch.save(rng_state(), tmp / "rng.pt")
    (tmp / STATE_FILE).write_text(text + "\n")


def load_state(directory: str | os.PathLike) -> dict[str, Any]:
    path = Path(directory) / STATE_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{directory}: not a trainer checkpoint (no {STATE_FILE})")
    state = json.loads(path.read_text())
    if state.get("format") != FORMAT:
        raise ValueError(f"{path}: checkpoint format {state.get('format')!r}, this posttrain reads {FORMAT}")
    return state


def load_tensors(directory: str | os.PathLike, name: str) -> Any:
    return torch.load(Path(directory) / name, map_location="cpu", weights_only=True)


ADAPTER_FILE = "adapter_model.safetensors"


def load_adapter(directory: str | os.PathLike) -> dict[str, torch.Tensor]:
    """A LoRA checkpoint's adapter tensors (peft's `adapter_model.safetensors`)."""
    from safetensors.torch import load_file

    path = Path(directory) / ADAPTER_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{directory}: a LoRA checkpoint without {ADAPTER_FILE}")
    return load_file(str(path))
