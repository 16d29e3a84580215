"""KV reuse across turns: the prefix cache alone, and multi-turn episodes through TorchPolicy."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from posttrain.policies.local import TorchPolicy
from posttrain.policies.prefix_cache import PrefixCache, weights_fingerprint
from posttrain.values.generation import GenerationRequest, Message, SamplingParams

MODEL = Path(__file__).resolve().parents[1] / "models" / "tiny-base"


def kv(n: int, tag: float = 0.0, layers: int = 2) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Fake keys/values whose value at position i is i + tag (so slices can be checked)."""
    pos = torch.arange(n, dtype=torch.float32)[None, :, None].expand(2, n, 4) + tag
    return [(pos.clone(), -pos.clone()) for _ in range(layers)]


def test_longest_prefix_is_found_across_entries_and_sliced():
    cache = PrefixCache(max_bytes=10**6, block=4)
    a = list(range(20))
    b = list(range(10)) + [99] * 10
    cache.insert(a, kv(20, 0.0))
    cache.insert(b, kv(20, 0.5))
    n, got = cache.lookup(list(range(13)) + [7, 7])
    assert n == 13 and got is not None and got[0][0].shape == (2, 13, 4)
    assert got[0][0][0, 12, 0] == 12.0  # from entry a
    n, got = cache.lookup(list(range(10)) + [99, 99, 5])
    assert n == 12 and got[1][0][0, 11, 0] == 11.5  # from entry b
    n, _ = cache.lookup(list(range(6)), limit=5)
    assert n == 5
    assert cache.lookup([1, 2, 3]) == (0, None)
    n, _ = cache.lookup([0, 1])  # shorter than a block still matches
    assert n == 2


def test_an_entry_covered_by_a_longer_one_is_replaced_and_lru_evicts_under_the_byte_budget():
    one = sum(k.nbytes + v.nbytes for k, v in kv(10))
    cache = PrefixCache(max_bytes=4 * one, block=4)
    turn1 = list(range(10))
    cache.insert(turn1, kv(10))
    turn2 = turn1 + [50, 51, 52, 53, 54]
    cache.insert(turn2, kv(15))
    assert len(cache) == 1 and cache.tokens == 15  # turn 1 is a prefix of turn 2: dropped
    cache.insert(turn1, kv(10))  # already covered: nothing added
    assert len(cache) == 1
    others = [[100 + i] * 10 for i in range(3)]
    cache.insert(others[0], kv(10))
    cache.lookup(turn2)  # refreshes turn 2: the oldest use is now others[0]
    cache.insert(others[1], kv(10))
    cache.insert(others[2], kv(10))
    assert cache.nbytes <= 4 * one and cache.evictions == 1
    assert cache.lookup(others[0])[0] == 0  # evicted, least recently used
    assert cache.lookup(turn2)[0] == 15
    with pytest.raises(ValueError, match="holds 9 positions for 10 tokens"):
        cache.insert(list(range(200, 210)), kv(9))


def test_changed_weights_empty_the_cache():
    model = torch.nn.Linear(2, 2)
    cache = PrefixCache(max_bytes=10**6, block=4)
    cache.check_weights(weights_fingerprint(model))
    cache.insert(list(range(8)), kv(8))
    cache.check_weights(weights_fingerprint(model))
    assert len(cache) == 1
    with torch.no_grad():
        model.weight.add_(1.0)  # what an optimizer step does
    cache.check_weights(weights_fingerprint(model))
    assert len(cache) == 0


@pytest.fixture(scope="module")
def plain() -> TorchPolicy:
    torch.set_num_threads(1)
    return TorchPolicy(MODEL, device="cpu")


def run_episodes(policy: TorchPolicy, n_episodes: int, turns: int, **sampling) -> list[list]:
    """Token-in/token-out multi-turn episodes on one-digit additions: turn k+1's prompt is turn
    k's prompt + completion + "\n" + a new problem, as token ids."""
    tok = policy.tokenizer
    ids = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    prompts = [[tok.bos_token_id] + ids(f"{e % 10}+{(3 * e) % 10}=") for e in range(n_episodes)]
    out: list[list] = [[] for _ in range(n_episodes)]
    for turn in range(turns):
        completions = policy.generate_ids(prompts, [SamplingParams(**sampling)] * n_episodes)
        for e, c in enumerate(completions):
            out[e].append(c)
            prompts[e] = prompts[e] + c.token_ids + ids(f"\n{(e + turn) % 9}+{turn}=")
    return out


@pytest.mark.parametrize("mode", ["standard", "fast"])
def test_reuse_across_turns_changes_no_output_and_skips_the_past(plain, mode):
    reuse = TorchPolicy(plain.model, plain.tokenizer, mode=mode, prefix_cache_mb=8)
    kwargs = dict(temperature=0.0, max_tokens=6, stop=("\n",))
    without = run_episodes(plain, 12, 8, **kwargs)
    with_ = run_episodes(reuse, 12, 8, **kwargs)
    for a, b in zip(without, with_):
        assert [(c.text, c.token_ids) for c in a] == [(c.text, c.token_ids) for c in b]
        for c in b:
            assert c.prefill_tokens + c.reused_tokens == len(c.prompt_token_ids)
        assert b[0].reused_tokens == 0
        for prev, c in zip(b, b[1:]):  # everything computed last turn is reused
            assert c.reused_tokens >= len(prev.prompt_token_ids) + len(prev.token_ids) - 1
    last = [e[-1] for e in with_]
    share = sum(c.reused_tokens for c in last) / sum(len(c.prompt_token_ids) for c in last)
    assert share >= 0.85
    assert all(c.reused_tokens == 0 and c.prefill_tokens == len(c.prompt_token_ids) for e in without for c in e)


def test_sampled_episodes_with_reuse_keep_target_logprobs(plain):
    reuse = TorchPolicy(plain.model, plain.tokenizer, prefix_cache_mb=8)
    episodes = run_episodes(reuse, 6, 4, temperature=1.0, max_tokens=6, stop=("\n",), seed=5)
    for c in (c for e in episodes for c in e):
        ids = torch.tensor([c.prompt_token_ids + c.token_ids])
        with torch.no_grad():
            logits = plain.model(input_ids=ids).logits[0, len(c.prompt_token_ids) - 1:-1]
        expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(c.token_ids)[:, None]).flatten()
        assert c.logprobs == pytest.approx(expected.tolist(), abs=1e-4)
    assert sum(c.reused_tokens for e in episodes for c in e[1:]) > 0


def test_a_weight_update_invalidates_reuse(plain):
    model = copy.deepcopy(plain.model)
    reuse = TorchPolicy(model, plain.tokenizer, prefix_cache_mb=8)
    request = GenerationRequest((Message("user", "reverse abcde=edcba\nreverse abc="),),
                                SamplingParams(temperature=0.0, max_tokens=8))
    reuse.generate([request])
    assert reuse.generate([request])[0].reused_tokens > 0
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.01)  # in place, as an optimizer step
    [after] = reuse.generate([request])
    assert after.reused_tokens == 0
    fresh = TorchPolicy(model, plain.tokenizer)
    assert after.token_ids == fresh.generate([request])[0].token_ids


def test_bad_budget_is_a_clear_error(plain):
    with pytest.raises(ValueError, match="prefix_cache_mb must be >= 0"):
        TorchPolicy(plain.model, plain.tokenizer, prefix_cache_mb=-1)


def test_rendered_messages_reuse_at_least_the_previous_prompt(plain):
    """Through `generate` (messages re-rendered each turn) the plain template puts a "\n"
    between the prompt and the answer the model wrote right after it, so only the previous
    prompt is shared; token-in/token-out episodes (above) share the completion too."""
    reuse = TorchPolicy(plain.model, plain.tokenizer, prefix_cache_mb=8)
    history = [Message("user", "3+4=")]
    previous = None
    for turn in range(4):
        [c] = reuse.generate([GenerationRequest(tuple(history), SamplingParams(temperature=0.0, max_tokens=4,
                                                                            stop=("\n",)))])
        [alone] = plain.generate([GenerationRequest(tuple(history), SamplingParams(temperature=0.0, max_tokens=4,
                                                                                stop=("\n",)))])
        assert c.token_ids == alone.token_ids
        if previous is not None:
            assert c.reused_tokens >= len(previous.prompt_token_ids)
        previous = c
        history += [Message("assistant", c.text), Message("user", f"{turn}+1=")]
