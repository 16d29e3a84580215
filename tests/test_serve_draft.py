"""`posttrain.policies.serve --mode fast --draft DIR`: a draft model's proposals verified by the
target inside the continuous batch (greedy output = standard output over loopback; sampled
tokens follow the target's distribution by the rejection test)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from posttrain.policies.local import TorchPolicy
from posttrain.policies.openai_compat import OpenAIConfig, OpenAIPolicy
from posttrain.policies.serve import PolicyServer, main
from posttrain.policies.server.engine import BatchEngine
from posttrain.values.generation import GenerationRequest, Message, SamplingParams

ROOT = Path(__file__).resolve().parents[1]
MODEL, DRAFT = ROOT / "models" / "tiny-base", ROOT / "models" / "tiny-base-draft"
PROMPTS = ["3+4=", "reverse abc=", "upper xyz=", "12 13 14 12 13", "sort 3,1,2=", "double ab=", "7*8="]


@pytest.fixture(scope="module")
def tiny():
    torch.set_num_threads(1)
    return TorchPolicy(MODEL, device="cpu")


def test_draft_model_greedy_output_is_the_standard_output_over_loopback(tiny):
    srv = PolicyServer(TorchPolicy(MODEL, device="cpu"), model_name="tiny-base", mode="fast",
                       draft=str(DRAFT)).start()
    try:
        remote = OpenAIPolicy(OpenAIConfig(base_url=srv.url, model="tiny-base", max_retries=0, max_concurrency=16))
        requests = [GenerationRequest((Message("user", PROMPTS[i % len(PROMPTS)] * (1 + i % 3)),),
                                      SamplingParams(temperature=0.0, max_tokens=6 + i % 19))
                    for i in range(28)]
        got = remote.generate(requests)
        stats = srv.engine.stats
    finally:
        srv.close()
    want = tiny.generate(requests)
    for g, w in zip(got, want):
        assert g.token_ids == w.token_ids and g.text == w.text and g.finish_reason == w.finish_reason
        assert g.logprobs == pytest.approx(w.logprobs, abs=1e-4)
    assert stats.drafted > 0 and stats.accepted > 0  # the draft model proposed, the target kept some
    assert stats.steps < stats.tokens


def test_draft_model_sampling_follows_the_target_distribution(tiny):
    """The second sampled token is decided by the rejection test against the draft's q; the
    pairs' counts must fit the target's exact p(t1) p(t2 | t1)."""
    engine = BatchEngine(TorchPolicy(MODEL, device="cpu"), mode="fast", draft=DRAFT, prefix_cache_mb=0,
                         max_batch=16).start()
    try:
        prompt = tiny.tokenizer("abcabcabcabcab")["input_ids"]
        n = 500
        futures = [engine.submit(prompt, SamplingParams(temperature=1.0, max_tokens=3, seed=s)) for s in range(n)]
        seqs = [tuple(f.result(timeout=300).token_ids[:2]) for f in futures]
        assert engine.stats.drafted > 0
    finally:
        engine.close()
    with torch.no_grad():
        p1 = torch.softmax(tiny.model(torch.tensor([prompt])).logits[0, -1].float(), -1)
        exact = {}
        for t1 in sorted({s[0] for s in seqs} | set(p1.topk(5).indices.tolist())):
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


def test_draft_needs_fast_mode_and_a_matching_model(tiny):
    with pytest.raises(ValueError, match="draft= is only used with mode='fast'"):
        BatchEngine(tiny, draft=DRAFT)
    with pytest.raises(ValueError, match="max_draft must be >= 1"):
        BatchEngine(tiny, mode="fast", max_draft=0)
    with pytest.raises(SystemExit):
        main(["--model", str(MODEL), "--draft", str(DRAFT)])
