"""Weights in flight between a trainer and an inference server: a directory of safetensors.

The `reload` sync method (vLLM's dev-mode `reload_weights`, and posttrain's own server) reads a
whole model from a directory the trainer wrote. Two details decide whether the server then
really serves the trainer's weights:

* **untied**: vLLM keeps its *old* output head after a reload when the model ties its output
  embedding to its input embedding, so the directory always carries `lm_head.weight` explicitly
  and the model a server starts from is an untied copy of the base model (`export_untied_model`,
  config `tie_word_embeddings = false`). Served that way, every reload replaces both.
* **atomic**: a server must never read a half-written directory. `write_weights` writes into a
  temporary sibling and renames it over the target (the previous directory is removed after the
  rename), so a reader sees the old weights or the new ones.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

WEIGHTS_FILE = "model.safetensors"


def untied_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's state dict with every tensor its own storage (tied weights copied apart),
    contiguous, on the CPU: what safetensors can write and what a server loads name by name."""
    out: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for name, tensor in model.state_dict().items():
        t = tensor.detach().to("cpu")
        if t.data_ptr() in seen:  # a tied weight: give it its own copy
            t = t.clone()
        seen.add(t.data_ptr())
        out[name] = t.contiguous()
    head = getattr(model, "get_output_embeddings", lambda: None)()
    if head is not None and not any(k.endswith("lm_head.weight") for k in out):
        # transformers drops a tied head from the state dict: add it back, explicitly
        out["lm_head.weight"] = head.weight.detach().to("cpu").clone().contiguous()
    return out


def write_weights(state: Mapping[str, torch.Tensor], directory: str | os.PathLike,
                  meta: Mapping[str, Any] | None = None) -> Path:
    """Write `state` as `<directory>/model.safetensors` atomically (plus `meta` as
    `sync.json`); returns the directory."""
    from safetensors.torch import save_file

    target = Path(directory)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        save_file(dict(state), str(tmp / WEIGHTS_FILE), metadata={"format": "pt"})
        if meta is not None:
            (tmp / "sync.json").write_text(json.dumps(dict(meta)) + "\n")
        old = None
        if target.exists():  # rename the old one aside first: os.replace cannot replace a dir
            old = target.with_name(f".{target.name}.old-{os.getpid()}-{id(tmp)}")
            os.replace(target, old)
        os.replace(tmp, target)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def export_untied_model(model_dir: str | os.PathLike, out_dir: str | os.PathLike) -> Path:
    """Copy a Hugging Face model directory with its output head untied (config
    `tie_word_embeddings = false`, `lm_head.weight` written): what a server that reloads
    weights must start from (see the module docstring)."""
    from transformers import AutoModelForCausalLM

    src, out = Path(model_dir), Path(out_dir)
    model = AutoModelForCausalLM.from_pretrained(src)
    out.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():  # tokenizer, generation config, version file: as they are
        if f.is_file() and not f.name.endswith((".safetensors", ".bin")) and f.name != "config.json":
            shutil.copy2(f, out / f.name)
    config = json.loads((src / "config.json").read_text())
    config["tie_word_embeddings"] = False
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    write_weights(untied_state_dict(model), out / "_weights")
    os.replace(out / "_weights" / WEIGHTS_FILE, out / WEIGHTS_FILE)
    shutil.rmtree(out / "_weights")
    return out


def read_weights(directory: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Every tensor of every `*.safetensors` file in `directory` (one file or shards)."""
    from safetensors.torch import load_file

    files = sorted(Path(directory).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{directory}: no *.safetensors file to load weights from")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    return state


@torch.no_grad()
def load_weights_into(model: Any, directory: str | os.PathLike) -> int:
    """Copy the weights of `directory` into `model` in place; returns the tensors loaded.

    Every parameter of the model must be in the directory (a partial update is an error naming
    what is missing). A tied output head is untied first when the directory's head differs from
    its input embedding, so the model then serves exactly the directory's weights."""
    state = read_weights(directory)
    head = getattr(model, "get_output_embeddings", lambda: None)()
    emb = getattr(model, "get_input_embeddings", lambda: None)()
    head_key = next((k for k in state if k.endswith("lm_head.weight")), None)
    if head is not None and emb is not None and head.weight is emb.weight and head_key is not None:
        head.weight = torch.nn.Parameter(head.weight.detach().clone(), requires_grad=False)
        model.config.tie_word_embeddings = False
    own = model.state_dict()
    if head is not None and emb is not None and head.weight is emb.weight:
        # still tied (the directory has no separate head): the embedding's copy loads both
        own = {k: v for k, v in own.items() if not k.endswith("lm_head.weight")}
    missing = sorted(set(own) - set(state))
    if missing:
        raise ValueError(f"{directory}: weights missing for {len(missing)} tensor(s) of the served "
                         f"model, e.g. {missing[:3]}")
    unknown = sorted(set(state) - set(own))
    if unknown:
        raise ValueError(f"{directory}: {len(unknown)} tensor(s) the served model does not have, "
                         f"e.g. {unknown[:3]}")
    for name, tensor in own.items():
        if tensor.shape != state[name].shape:
            raise ValueError(f"{directory}: tensor {name} has shape {tuple(state[name].shape)}, "
                             f"the served model's is {tuple(tensor.shape)}")
        tensor.copy_(state[name].to(tensor.dtype))
    return len(state)
