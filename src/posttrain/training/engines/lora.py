"""LoRA adapters (the `peft` library): only low-rank adapter matrices are trained.

    [trainer]
    lora = {r = 8, alpha = 16, target_modules = ["c_attn", "c_proj"]}   # or "all-linear"

The base weights stay frozen; the optimizer holds the adapters alone, and a checkpoint holds the
adapters alone (`adapter_model.safetensors`, peft's format, plus the base model's path in the
trainer state): megabytes where the model is gigabytes. Samplers never see adapters: after each
update the merged weights W + (alpha / r) * B @ A are written into a plain copy of the model
(`merged_state`), which is what generation, version hashes and weight sync read.

Not built: LoRA under the `fsdp` engine (the merge reads each adapter layer's full weights;
sharded, that needs a gather per layer), and the KL reference as "adapters off" (the reference
is a frozen copy of the base, as without LoRA).
"""

from __future__ import annotations

import copy
from typing import Any, cast

import torch


def wrap(model: torch.nn.Module, settings: Any) -> torch.nn.Module:
    """A `peft` LoRA model around a copy of `model` (the original stays a plain module)."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError:
        raise RuntimeError("[trainer] lora needs peft: pip install 'posttrain[lora]'") from None
    targets = settings.target_modules
    config = LoraConfig(r=settings.r, lora_alpha=settings.alpha, lora_dropout=settings.dropout,
                        target_modules=targets if isinstance(targets, str) else list(targets))
    try:
        return get_peft_model(copy.deepcopy(model), config)
    except ValueError as e:  # peft names the modules it could not find
        raise ValueError(f"TrainerConfig.lora.target_modules {targets!r}: {e}") from None


def merged_state(peft_model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The plain model's state dict with every adapter merged into its base weight (the peft
    model itself is left as it is: no merge/unmerge round trip that would drift the base)."""
    from peft.tuners.lora import LoraLayer

    base = peft_model.get_base_model()  # type: ignore[operator]  # a peft method
    merged: dict[str, torch.Tensor] = {}
    for name, module in base.named_modules():
        if isinstance(module, LoraLayer):
            weight = cast(torch.Tensor, module.get_base_layer().weight)
            # every LoRA layer kind (Linear, GPT-2's Conv1D, Embedding) defines it, in its
            # base weight's layout; the base class does not declare it
            delta = module.get_delta_weight(module.active_adapters[0])  # type: ignore[attr-defined]
            merged[f"{name}.base_layer.weight"] = weight.detach() + delta.detach()
    out: dict[str, torch.Tensor] = {}
    for key, value in base.state_dict().items():
        if ".lora_" in key:
            continue
        out[key.replace(".base_layer.", ".")] = merged.get(key, value)
    return out


def adapter_state(peft_model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The adapter tensors only (what a checkpoint keeps)."""
    from peft import get_peft_model_state_dict

    return {k: v.detach().cpu().contiguous() for k, v in get_peft_model_state_dict(peft_model).items()}


def load_adapter(peft_model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    from peft import set_peft_model_state_dict

    result = set_peft_model_state_dict(peft_model, state)
    unexpected = getattr(result, "unexpected_keys", [])
    if unexpected:
        raise ValueError(f"adapter checkpoint: tensors this LoRA model does not have: {unexpected[:5]}")
