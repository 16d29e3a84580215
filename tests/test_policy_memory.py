"""Generation batches bounded by estimated memory: long prompts are split into smaller batches
(never one batch asking for tens of GB), with the same results as one batch."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from posttrain.policies.local import TorchPolicy
from posttrain.policies.memory import MemoryModel, plan_batches
from posttrain.values.generation import GenerationRequest, Message, SamplingParams

MODEL = Path(__file__).resolve().parents[1] / "models" / "tiny-base"


def test_memory_model_reads_the_shape_and_grows_with_rows_and_length():
    module = torch.nn.Linear(2, 2).to(torch.bfloat16)
    module.config = SimpleNamespace(num_hidden_layers=32, hidden_size=4096, num_attention_heads=32,
                                    num_key_value_heads=8, intermediate_size=14336, vocab_size=128256)
    m = MemoryModel.of(module)
    assert m.kv_per_token == 2 * 32 * 1024 * 2  # grouped-query attention: 8 of 32 heads keep k/v
    # 256 rows of 4k-token prompts: hundreds of GB, the failure this guards against
    assert m.batch_bytes(256, 4096, 4352) > 100 * 2**30
    assert m.batch_bytes(2, 4096, 4352) < m.batch_bytes(4, 4096, 4352) < m.batch_bytes(4, 8192, 8448)


def test_plan_splits_long_rows_keeps_short_ones_together_and_keeps_order():
    m = MemoryModel(kv_per_token=1000, act_per_token=0, attn_per_pair=0, logits_per_row=0)
    lengths = [(10, 20)] * 8 + [(900, 1000)] * 4 + [(10, 20)] * 3
    plan = plan_batches(lengths, m, cap_bytes=2_100_000, max_rows=256)
    assert plan[0] == (0, 8)  # 8 short rows: 8 x 20 x 1000 bytes
    assert plan[1:] == [(8, 10), (10, 12), (12, 15)]  # long rows: 2 x 1000 x 1000 fit, 3 do not
    assert [i for lo, hi in plan for i in range(lo, hi)] == list(range(len(lengths)))
    for lo, hi in plan:
        if hi - lo > 1:
            p, t = max(x[0] for x in lengths[lo:hi]), max(x[1] for x in lengths[lo:hi])
            assert m.batch_bytes(hi - lo, p, t) <= 2_100_000
    # a row alone over the cap still runs (alone); the row limit holds too
    assert plan_batches([(5000, 6000)] * 2, m, cap_bytes=10, max_rows=8) == [(0, 1), (1, 2)]
    assert plan_batches([(1, 2)] * 5, m, cap_bytes=10**12, max_rows=2) == [(0, 2), (2, 4), (4, 5)]


@pytest.mark.skipif(not (MODEL / "config.json").is_file(), reason="models/tiny-base is not present")
def test_a_batch_over_the_cap_is_split_with_the_results_of_one_batch():
    roomy = TorchPolicy(MODEL, device="cpu", memory_mb=10_000)
    tight = TorchPolicy(MODEL, device="cpu", memory_mb=0.05)  # ~50 KB: a few rows of 60 tokens
    calls: list[int] = []
    real = tight._generate_batch

    def counting(prompts, sampling):
        calls.append(len(prompts))
        return real(prompts, sampling)

    tight._generate_batch = counting  # type: ignore[method-assign]
    long_prompt = "reverse: " + "abcdefghij" * 5 + "\n"
    requests = [GenerationRequest((Message("user", long_prompt if i % 3 else f"{i}+{i}="),),
                                  SamplingParams(temperature=1.0, max_tokens=8, seed=100 + i))
                for i in range(12)]
    lengths = [(len(roomy.render(r)), len(roomy.render(r)) + 8) for r in requests]
    assert tight.memory.batch_bytes(12, max(p for p, _ in lengths), max(t for _, t in lengths)) > tight.memory_cap
    a = roomy.generate(requests)
    b = tight.generate(requests)
    assert len(calls) > 1 and sum(calls) == 12 and max(calls) < 12
    for x, y in zip(a, b):
        assert x.token_ids == y.token_ids and x.text == y.text and x.finish_reason == y.finish_reason
        assert x.logprobs == pytest.approx(y.logprobs, abs=1e-4)


def test_memory_cap_is_validated():
    with pytest.raises(ValueError, match="memory_mb must be > 0, got 0"):
        TorchPolicy(MODEL, device="cpu", memory_mb=0)
