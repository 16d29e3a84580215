"""LoRA adapters: only adapters train, checkpoints hold only adapters, samplers get merged weights."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from posttrain.training.config import LoraSettings, TrainerConfig
from posttrain.training.engines.parity import MODEL, batches
from posttrain.training.trainer import Trainer

# checked without importing peft (and transformers with it) when the module is collected
pytestmark = pytest.mark.skipif(importlib.util.find_spec("peft") is None,
                                reason="LoRA needs peft (pip install 'posttrain[lora]')")


@pytest.fixture(autouse=True)
def one_thread():
    torch.set_num_threads(1)


def _logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        return model(input_ids=ids).logits


@pytest.mark.slow
def test_lora_trains_adapters_only_checkpoints_them_and_merges_for_the_sampler(tmp_path):
    from safetensors.torch import load_file

    config = TrainerConfig(lr=1e-2, ppo_epochs=2, micro_batch_size=8,
                           lora=LoraSettings(r=4, alpha=8, target_modules=["c_attn", "c_fc"]))
    trainer = Trainer(MODEL, config)
    base = Trainer(MODEL, TrainerConfig()).model
    trained = {n for n, p in trainer.engine.model.named_parameters() if p.requires_grad}
    assert trained and all(".lora_" in n for n in trained)
    assert sum(len(g["params"]) for g in trainer.optimizer.param_groups) == len(trained)
    ids = torch.tensor([trainer.tokenizer("reverse abc=")["input_ids"]])
    before = _logits(trainer.model, ids)
    torch.testing.assert_close(before, _logits(base, ids))  # B starts at 0: no change yet
    for groups in batches(MODEL, 2):
        trainer.step(groups)
    after = _logits(trainer.model, ids)
    assert (after - before).abs().max() > 1e-3  # the sampler's (merged) model moved
    # the merged weights are the base plus the adapters, exactly what the peft model computes
    torch.testing.assert_close(after, _logits(trainer.engine.model, ids), rtol=1e-5, atol=1e-5)
    frozen = {n.replace("base_model.model.", "").replace(".base_layer", ""): p
              for n, p in trainer.engine.model.named_parameters() if not p.requires_grad}
    for name, p in base.named_parameters():  # the base weights under the adapters never moved
        torch.testing.assert_close(frozen[name], p, rtol=0, atol=0, msg=name)

    saved = trainer.save(tmp_path / "ckpt")
    assert not (saved / "model.safetensors").exists()
    adapter = load_file(str(saved / "adapter_model.safetensors"))
    assert adapter and all(".lora_" in k for k in adapter)
    size = sum(t.numel() for t in adapter.values())
    assert size < 0.1 * sum(p.numel() for p in base.parameters())

    resumed = Trainer.resume(saved)
    assert resumed.version.weights_hash == trainer.version.weights_hash
    torch.testing.assert_close(_logits(resumed.model, ids), after)
    exported = resumed.engine.export_weights()
    assert "lm_head.weight" in exported and not any("lora" in k for k in exported)


def test_lora_settings_are_checked():
    with pytest.raises(ValueError, match="r"):
        LoraSettings(r=0)
    with pytest.raises(ValueError, match="local"):
        TrainerConfig(engine="fsdp", lora=LoraSettings())
    cfg = TrainerConfig.from_dict({"lora": {"r": 4, "alpha": 8, "target_modules": ["c_attn"]}})
    assert cfg.lora == LoraSettings(r=4, alpha=8, target_modules=["c_attn"])
