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


def test_longest_prefix_is_found_across_entries_and_shared_prefixes_are_stored_once():
    cache = PrefixCache(max_bytes=10**6)
    a = list(range(20))
    b = list(range(10)) + [99] * 10
    cache.insert(a, kv(20, 0.0))
    cache.insert(b, kv(20, 0.5))
    assert cache.tokens == 30 and len(cache) == 3  # the shared 10 once: a split into 10 + 10, b's 10
    assert cache.nbytes == sum(k.nbytes + v.nbytes for k, v in kv(30))
    n, got = cache.lookup(list(range(13)) + [7, 7])
    assert n == 13 and got is not None and got[0][0].shape == (2, 13, 4)
    assert got[0][0][0, 12, 0] == 12.0  # from entry a
    n, got = cache.lookup(list(range(10)) + [99, 99, 5])
    assert n == 12 and got is not None
    assert got[1][0][0, 11, 0] == 11.5 and got[1][0][0, 3, 0] == 3.0  # b's own tail, a's shared head
    assert torch.equal(got[0][1], -got[0][0])  # values next to their keys
    n, _ = cache.lookup(list(range(6)), limit=5)
    assert n == 5
    assert cache.lookup([1, 2, 3]) == (0, None)
    n, _ = cache.lookup([0, 1])  # a partial edge still matches
    assert n == 2
    cache.insert(a[:15], kv(15))  # already covered: nothing added
    assert cache.tokens == 30


def test_a_group_sharing_a_prompt_stores_it_once_and_lru_evicts_leaves_under_a_token_budget():
    prompt = list(range(100, 140))
    cache = PrefixCache(max_tokens=40 + 8 * 5)
    for i in range(8):  # a GRPO group: one prompt, eight completions
        cache.insert(prompt + [i] * 5, kv(45, float(i)))
    assert cache.tokens == 80 and cache.evictions == 0
    cache.lookup(prompt + [0] * 5)  # refreshes completion 0
    cache.insert(prompt + [9] * 5, kv(45))  # over budget: the least recently used leaf goes
    assert cache.tokens == 80 and cache.evictions == 1
    assert cache.lookup(prompt + [1] * 5)[0] == 40  # completion 1 evicted, the prompt kept
    assert cache.lookup(prompt + [0] * 5)[0] == 45 and cache.lookup(prompt + [9] * 5)[0] == 45
    cache.insert(list(range(500, 580)), kv(80))  # needs everything: the shared prompt goes last
    assert cache.tokens <= 80 and cache.lookup(prompt)[0] == 0
    with pytest.raises(ValueError, match="holds 9 positions for 10 tokens"):
        cache.insert(list(range(200, 210)), kv(9))
    with pytest.raises(ValueError, match="needs a budget"):
        PrefixCache()
    with pytest.raises(ValueError, match="max_tokens must be >= 0, got -1"):
        PrefixCache(max_tokens=-1)


def test_a_pinned_path_is_never_evicted_until_released():
    cache = PrefixCache(max_tokens=30)
    running = list(range(20))
    cache.insert(running, kv(20))
    n, got, handle = cache.acquire(running + [1, 2, 3])
    assert n == 20 and got is not None and handle is not None
    cache.insert(list(range(50, 70)), kv(20))  # over budget: only the new, unpinned leaf can go
    assert cache.lookup(running)[0] == 20
    assert cache.tokens == 20 and cache.evictions == 1
    pinned = cache.insert(list(range(70, 95)), kv(25), lock=True)  # two pinned paths: over budget
    assert cache.tokens == 45 and cache.lookup(running)[0] == 20
    cache.release(handle)  # now the older one can go
    assert cache.tokens == 25 and cache.lookup(running)[0] == 0
    assert cache.lookup(list(range(70, 95)))[0] == 25
    cache.release(pinned)
    assert cache.acquire([7, 7]) == (0, None, None)
    cache.release(None)
    _, _, stale = cache.acquire(list(range(70, 80)))
    cache.clear()  # a reload: the handle from before releases harmlessly
    cache.release(stale)
    assert cache.tokens == 0 and len(cache) == 0


def test_changed_weights_empty_the_cache():
    model = torch.nn.Linear(2, 2)
    cache = PrefixCache(max_bytes=10**6)
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
