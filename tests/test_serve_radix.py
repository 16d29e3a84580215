"""The server's radix prefix cache: different requests share keys/values by token prefix (not
only an episode's exact previous request), the output never changes, and a small budget evicts
without breaking anything."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from posttrain.policies.local import TorchPolicy
from posttrain.policies.server.engine import BatchEngine
from posttrain.values.generation import SamplingParams

MODEL = Path(__file__).resolve().parents[1] / "models" / "tiny-base"
INSTRUCTION = "reverse the word, then upper it: "
GREEDY = SamplingParams(temperature=0.0, max_tokens=10)


@pytest.fixture(scope="module")
def tiny() -> TorchPolicy:
    torch.set_num_threads(1)
    return TorchPolicy(MODEL, device="cpu")


def ids(policy: TorchPolicy, text: str) -> list[int]:
    return policy.tokenizer(text, add_special_tokens=False)["input_ids"]


def reference(policy: TorchPolicy, prompts: list[list[int]]) -> list[list[int]]:
    return [c.token_ids for c in policy.generate_ids(prompts, [GREEDY] * len(prompts))]


@pytest.mark.parametrize("mode", ["standard", "fast"])
def test_two_requests_sharing_an_instruction_reuse_it_and_answer_as_without_cache(tiny, mode):
    words = ["abc", "xyz", "hello", "tool", "kth", "rle"]
    prompts = [ids(tiny, INSTRUCTION + w + "=") for w in words]
    shared = len(ids(tiny, INSTRUCTION))
    engine = BatchEngine(TorchPolicy(tiny.model, tiny.tokenizer), mode=mode, prefix_cache_mb=4).start()
    try:
        # one at a time: each prompt differs from every earlier one after the instruction, so
        # only a longest-shared-prefix match (not an exact earlier request) can serve it
        got = [engine.submit(p, GREEDY).result(timeout=120) for p in prompts]
        stats = engine.prefix_cache.stats()  # type: ignore[union-attr]
    finally:
        engine.close()
    assert [c.token_ids for c in got] == reference(tiny, prompts)
    assert got[0].reused_tokens == 0
    for c in got[1:]:
        assert c.reused_tokens >= shared - 1 and c.reused_tokens > 0
        assert c.prefill_tokens + c.reused_tokens == len(c.prompt_token_ids)
    # the instruction is stored once: the tree holds far fewer tokens than the sequences together
    total = sum(len(c.prompt_token_ids) + len(c.token_ids) for c in got)
    assert stats["tokens"] <= total - (len(got) - 1) * (shared - 1)
    assert stats["reused_tokens"] == sum(c.reused_tokens for c in got)


def test_a_request_arriving_while_another_runs_reuses_its_prompt(tiny):
    engine = BatchEngine(TorchPolicy(tiny.model, tiny.tokenizer), prefix_cache_mb=4).start()
    try:
        long_one = engine.submit(ids(tiny, INSTRUCTION + "abc="), SamplingParams(temperature=0.0, max_tokens=90),
                                 ignore_eos=True)
        # the first request is admitted (its prompt cached and pinned) before the second arrives
        while engine.rows_in_flight == 0:
            pass
        second = engine.submit(ids(tiny, INSTRUCTION + "zz="), GREEDY).result(timeout=120)
        assert not long_one.done()  # 10 tokens decoded next to its 90: it was still running
        long_one.result(timeout=120)
    finally:
        engine.close()
    assert second.reused_tokens >= len(ids(tiny, INSTRUCTION)) - 1
    assert second.token_ids == reference(tiny, [ids(tiny, INSTRUCTION + "zz=")])[0]


def test_eviction_under_a_small_budget_stays_correct(tiny):
    """A budget of a few sequences' keys/values: 8-turn episodes on 6 tasks evict all the time,
    and every answer is still the no-cache answer, every usage still adds up."""
    layers, heads = tiny.model.config.n_layer, tiny.model.config.n_head
    dim = tiny.model.config.n_embd // heads
    token_bytes = 2 * layers * heads * dim * 4
    budget_mb = 120 * token_bytes / 2**20  # about 120 tokens: a few short episodes' worth
    engine = BatchEngine(TorchPolicy(tiny.model, tiny.tokenizer), prefix_cache_mb=budget_mb, max_batch=4).start()
    plain = TorchPolicy(tiny.model, tiny.tokenizer)
    sampling = SamplingParams(temperature=0.0, max_tokens=5, stop=("\n",))
    episodes = [ids(tiny, f"{e}+{e + 1}=") for e in range(6)]
    try:
        for turn in range(8):
            futures = [engine.submit(p, sampling) for p in episodes]
            got = [f.result(timeout=120) for f in futures]
            want = plain.generate_ids(episodes, [sampling] * len(episodes))
            assert [c.token_ids for c in got] == [c.token_ids for c in want]
            for c in got:
                assert c.prefill_tokens + c.reused_tokens == len(c.prompt_token_ids)
            episodes = [p + c.token_ids + ids(tiny, f"\n{turn}+{e}=") for e, (p, c) in enumerate(zip(episodes, got))]
        cache = engine.prefix_cache
        assert cache is not None
        assert cache.evictions > 0 and cache.tokens <= 120 + 1
        assert cache.reused_tokens > 0
    finally:
        engine.close()
