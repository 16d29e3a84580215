"""`posttrain.policies.serve --mode fast`: prompt-lookup speculative decoding inside the
continuous-batching engine (greedy output = standard output; sampled tokens follow the model's
distribution), and the prefix cache's reuse reported in each response's `usage`."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest
import torch

from posttrain.policies.local import TorchPolicy
from posttrain.policies.openai_compat import OpenAIConfig, OpenAIPolicy
from posttrain.policies.serve import PolicyServer, main
from posttrain.policies.server.engine import BatchEngine
from posttrain.values.generation import GenerationRequest, Message, SamplingParams

MODEL = Path(__file__).resolve().parents[1] / "models" / "tiny-base"
# copy-heavy prompts: their own n-grams recur, so prompt lookup has something to draft
PROMPTS = ["abcabcabcabcab", "reverse abc=cba reverse abc=", "12 13 14 12 13 14 12 13",
           "sort 3,1,2=1,2,3 sort 3,1,2=", "upper xyz=XYZ upper xyz=", "aaaaaaaaaaaa"]


def post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as r:
        return json.loads(r.read())


@pytest.fixture(scope="module")
def tiny():
    return TorchPolicy(MODEL, device="cpu")


@pytest.fixture(scope="module")
def fast(tiny):
    srv = PolicyServer(TorchPolicy(MODEL, device="cpu"), model_name="tiny-base", mode="fast").start()
    yield srv
    srv.close()


def test_fast_greedy_output_is_the_standard_output_over_loopback(fast, tiny):
    remote = OpenAIPolicy(OpenAIConfig(base_url=fast.url, model="tiny-base", max_retries=0, max_concurrency=32))
    requests = [GenerationRequest((Message("user", PROMPTS[i % len(PROMPTS)]),),
                                  SamplingParams(temperature=0.0, max_tokens=8 + i % 17))
                for i in range(36)]
    before = fast.engine.stats.accepted
    got = remote.generate(requests)
    want = tiny.generate(requests)
    for g, w in zip(got, want):
        assert g.token_ids == w.token_ids and g.text == w.text and g.finish_reason == w.finish_reason
        assert g.logprobs == pytest.approx(w.logprobs, abs=1e-4)
    stats = fast.engine.stats
    assert stats.accepted - before > 0 and stats.drafted >= stats.accepted  # it did speculate
    assert stats.steps < stats.tokens  # fewer forwards than tokens: several tokens per step


def test_fast_sampling_follows_the_model_distribution(tiny):
    """Sampled tokens after a repetitive prompt: the second is decided by verifying a draft.
    The sequences' counts must fit the model's exact probabilities p(t1) p(t2 | t1)."""
    # 16 rows at a time: a full batch of 256 would leave no room for drafts (VERIFY_TOKENS)
    engine = BatchEngine(TorchPolicy(MODEL, device="cpu"), mode="fast", prefix_cache_mb=0, max_batch=16).start()
    try:
        prompt = tiny.tokenizer("abcabcabcabcab")["input_ids"]
        n = 600
        # a third token leaves room for a one-token draft after the first (it is not looked at)
        futures = [engine.submit(prompt, SamplingParams(temperature=1.0, max_tokens=3, seed=s)) for s in range(n)]
        seqs = [tuple(f.result(timeout=300).token_ids[:2]) for f in futures]
        assert engine.stats.drafted > 0
    finally:
        engine.close()
    with torch.no_grad():
        p1 = torch.softmax(tiny.model(torch.tensor([prompt])).logits[0, -1].float(), -1)
        firsts = sorted({s[0] for s in seqs} | set(p1.topk(5).indices.tolist()))
        exact = {}
        for t1 in firsts:
            p2 = torch.softmax(tiny.model(torch.tensor([prompt + [t1]])).logits[0, -1].float(), -1)
            for t2 in p2.topk(8).indices.tolist():
                exact[(t1, t2)] = float(p1[t1] * p2[t2])
    bins = [k for k, p in sorted(exact.items(), key=lambda kv: -kv[1]) if p * n >= 5]
    assert len(bins) >= 2
    observed = [sum(s == b for s in seqs) for b in bins] + [sum(s not in bins for s in seqs)]
    expected = [exact[b] * n for b in bins]
    expected.append(n - sum(expected))
    from scipy.stats import chisquare  # imported here: scipy is slow to import at collection

    assert chisquare(observed, expected).pvalue > 1e-3, (observed, expected)


def test_usage_reports_reused_prefix_tokens(fast, tiny):
    first = post(f"{fast.url}/completions", {"model": "tiny-base", "prompt": "37+48=", "max_tokens": 6,
                                             "temperature": 0, "return_token_ids": True})
    choice = first["choices"][0]
    assert first["usage"]["prefill_tokens"] + first["usage"]["reused_tokens"] == first["usage"]["prompt_tokens"]
    history = choice["prompt_token_ids"] + choice["token_ids"]
    nxt = post(f"{fast.url}/completions", {"model": "tiny-base", "prompt": history + [5, 6], "max_tokens": 3,
                                           "temperature": 0})
    usage = nxt["usage"]
    assert usage["reused_tokens"] >= len(choice["prompt_token_ids"])  # the earlier turn's keys/values
    assert usage["prompt_tokens_details"]["cached_tokens"] == usage["reused_tokens"]
    assert usage["prefill_tokens"] == usage["prompt_tokens"] - usage["reused_tokens"]


def test_mode_is_validated():
    with pytest.raises(ValueError, match="mode"):
        BatchEngine(TorchPolicy(MODEL, device="cpu"), mode="turbo")
    with pytest.raises(SystemExit):
        main(["--model", str(MODEL), "--mode", "turbo"])


def test_openai_policy_records_the_servers_prefix_reuse(fast):
    remote = OpenAIPolicy(OpenAIConfig(base_url=fast.url, model="tiny-base", max_retries=0))
    first = GenerationRequest((Message("user", "reverse abc="),), SamplingParams(temperature=0.0, max_tokens=6))
    [one] = remote.generate([first])
    assert one.prefill_tokens + one.reused_tokens == len(one.prompt_token_ids)
    nxt = GenerationRequest(first.messages + (Message("assistant", one.text), Message("user", "again")),
                            SamplingParams(temperature=0.0, max_tokens=4))
    [two] = remote.generate([nxt])
    assert two.reused_tokens >= len(one.prompt_token_ids)  # the first turn's keys/values, reused
    assert two.prefill_tokens + two.reused_tokens == len(two.prompt_token_ids)
