"""TorchPolicy on the shipped tiny model and on a second, randomly initialised Llama."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from posttrain.policies.base import PolicyError
from posttrain.policies.local import TorchPolicy, weights_hash
from posttrain.policies.render import render_ids
from posttrain.values.generation import GenerationRequest, Message, SamplingParams

MODEL = Path(__file__).resolve().parents[1] / "models" / "tiny-base"
PROMPTS = ["37+48=", "reverse abc=", "max(3,9,4)=", "upper xyz=", "caesar+3 abc=", "5*7="]


def req(prompt: str, **sampling) -> GenerationRequest:
    return GenerationRequest((Message("user", prompt),), SamplingParams(**sampling))


@pytest.fixture(scope="module")
def policy(tiny_policy) -> TorchPolicy:
    return tiny_policy


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory) -> Path:
    """A randomly initialised tiny Llama with the shipped tokenizer: any HF causal LM works."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(MODEL)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id)
    path = tmp_path_factory.mktemp("llama")
    LlamaForCausalLM(config).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def test_single_user_message_renders_to_exactly_the_prompt(policy):
    ids = policy.render(req("37+48="))
    chars = policy.tokenizer("37+48=", add_special_tokens=False)["input_ids"]
    assert ids == [policy.tokenizer.bos_token_id] + chars
    assert policy.tokenizer.decode(ids, skip_special_tokens=True) == "37+48="
    two = GenerationRequest((Message("system", "be brief"), Message("user", "1+1=")))
    assert policy.tokenizer.decode(policy.render(two), skip_special_tokens=True) == "be brief\n1+1="


def test_version_is_read_from_the_directory(policy):
    stored = json.loads((MODEL / "policy_version.json").read_text())
    assert policy.version.name == stored["name"] and policy.version.parent is None
    assert policy.version.weights_hash == weights_hash(policy.model)
    assert len(policy.version.tokenizer_hash) == 64


def test_stop_strings_cut_text_and_tokens(policy):
    out = policy.generate([req(p, temperature=0.0, max_tokens=20, stop=("\n",)) for p in PROMPTS])
    for c in out:
        assert "\n" not in c.text
        assert c.token_ids is not None and c.logprobs is not None
        assert len(c.token_ids) == len(c.logprobs)
        # the tokens keep the stop string (the model's decision to stop, trained like any token)
        decoded = policy.tokenizer.decode(c.token_ids, skip_special_tokens=True)
        assert decoded in (c.text, c.text + "\n")
        assert (decoded == c.text + "\n") == (c.finish_reason == "stop" and c.token_ids[-1] not in policy.eos_ids)
    # the model ends answers with "\n" (it was trained to), so greedy answers stop, not run out
    assert sum(c.finish_reason == "stop" for c in out) >= len(PROMPTS) - 1
    # a stop string inside the answer cuts there (the shipped model answers "cba")
    [full] = policy.generate([req("reverse abc=", temperature=0.0, max_tokens=10, stop=("\n",))])
    assert full.text == "cba"
    [cut] = policy.generate([req("reverse abc=", temperature=0.0, max_tokens=10, stop=("ba",))])
    assert cut.text == "c" and cut.finish_reason == "stop" and len(cut.token_ids) == 3  # c, b, a
    assert cut.token_ids == full.token_ids[:3] and cut.logprobs == full.logprobs[:3]


def test_max_tokens_is_a_length_finish(policy):
    out = policy.generate([req(p, temperature=1.0, max_tokens=3, seed=i) for i, p in enumerate(PROMPTS)])
    for c in out:
        assert len(c.token_ids) <= 3
        if c.finish_reason == "length":
            assert len(c.token_ids) == 3


def test_batch_time_is_shared_between_completions_not_counted_per_row(policy):
    # a batch of 6: each completion carries its share (by tokens decoded), so the shares add up
    # to the batch's time and a longer completion costs more than a shorter one
    import time
    reqs = [req(p, temperature=1.0, max_tokens=12 if i % 2 else 2, stop=(), seed=i)
            for i, p in enumerate(PROMPTS)]
    t0 = time.perf_counter()
    out = policy.generate(reqs)
    wall = time.perf_counter() - t0
    total = sum(c.gen_s for c in out)
    assert 0 < total <= wall
    assert all(c.gen_s < total / 2 for c in out)
    longest = max(out, key=lambda c: len(c.token_ids))
    shortest = min(out, key=lambda c: len(c.token_ids))
    if len(longest.token_ids) > len(shortest.token_ids):
        assert longest.gen_s > shortest.gen_s


def teacher_forced(policy: TorchPolicy, prompt_ids: list[int], completion: list[int], temperature: float):
    ids = torch.tensor([prompt_ids + completion])
    with torch.no_grad():
        logits = policy.model(input_ids=ids).logits[0, len(prompt_ids) - 1:-1].float()
    logp = torch.log_softmax(logits / temperature, dim=-1)
    return logp.gather(-1, torch.tensor(completion)[:, None]).flatten().tolist()


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 0.9)])
def test_logprobs_match_teacher_forced_recompute(policy, temperature, top_p):
    out = policy.generate([req(p, temperature=temperature, top_p=top_p, max_tokens=8, seed=3)
                           for p in PROMPTS])
    for c in out:
        expected = teacher_forced(policy, c.prompt_token_ids, c.token_ids, temperature)
        assert c.logprobs == pytest.approx(expected, abs=1e-4)


def test_kv_cache_batched_and_uncached_greedy_are_identical(policy, monkeypatch):
    requests = [req(p, temperature=0.0, max_tokens=12) for p in PROMPTS]  # no stop: full length
    cached = policy.generate(requests)
    monkeypatch.setattr(policy, "use_cache", False)
    uncached = policy.generate(requests)
    monkeypatch.undo()
    alone = [policy.generate([r])[0] for r in requests]
    assert [c.token_ids for c in cached] == [c.token_ids for c in uncached] == [c.token_ids for c in alone]
    assert [c.text for c in cached] == [c.text for c in uncached]


def test_seeds_reproduce_and_differ(policy):
    a = policy.generate([req("caesar+3 abc=", temperature=1.0, max_tokens=8, seed=s) for s in range(8)])
    b = policy.generate([req("caesar+3 abc=", temperature=1.0, max_tokens=8, seed=s) for s in range(8)])
    assert [c.token_ids for c in a] == [c.token_ids for c in b]
    hot = policy.generate([req("caesar+3 abc=", temperature=3.0, max_tokens=8, seed=s) for s in range(8)])
    assert len({tuple(c.token_ids) for c in hot}) > 1


def test_a_prompt_longer_than_the_context_is_a_per_request_error(policy):
    too_long = "1" * (policy.max_positions + 5) + "="
    out = policy.generate([req(too_long, max_tokens=4), req("1+1=", temperature=0.0, max_tokens=4)])
    assert out[0].finish_reason == "error" and "context" in out[0].error
    assert out[1].finish_reason in ("stop", "length") and out[1].token_ids


def test_context_limit_cuts_with_length(policy):
    prompt = "1" * (policy.max_positions - 4)
    [c] = policy.generate([req(prompt, temperature=1.0, max_tokens=50, seed=0)])
    assert len(c.prompt_token_ids) + len(c.token_ids) <= policy.max_positions
    assert c.finish_reason in ("length", "stop")


def test_not_a_model_directory_is_a_policy_error(tmp_path):
    with pytest.raises(PolicyError, match="no config.json"):
        TorchPolicy(tmp_path)


def test_any_hf_causal_lm_works_the_same_way(llama_dir):
    llama = TorchPolicy(llama_dir, device="cpu")
    requests = [req(p, temperature=0.0, max_tokens=6) for p in PROMPTS[:4]]
    cached = llama.generate(requests)
    llama.use_cache = False
    uncached = llama.generate(requests)
    assert [c.token_ids for c in cached] == [c.token_ids for c in uncached]
    sampled = llama.generate([req(p, temperature=0.8, max_tokens=6, seed=1) for p in PROMPTS[:4]])
    llama.use_cache = True
    for c in sampled:
        expected = teacher_forced(llama, c.prompt_token_ids, c.token_ids, 0.8)
        assert c.logprobs == pytest.approx(expected, abs=1e-4)


def test_chat_template_is_used_when_the_tokenizer_has_one(llama_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(llama_dir)
    tok.chat_template = ("{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}\n{% endfor %}"
                         "{% if add_generation_prompt %}[assistant]{% endif %}")
    ids = render_ids(tok, (Message("user", "hi"),))
    assert tok.decode(ids) == "[user]hi\n[assistant]"  # no BOS added on top of the template


def test_the_shipped_model_has_latent_capability(policy):
    """pass@8 well above pass@1 on eval-split problems it never saw (models/README.md)."""
    from posttrain.evaluation.quick import pass_rates
    from posttrain.tasks.registry import get_domain

    result = pass_rates(policy, [get_domain("text.upper.l3"), get_domain("text.reverse.l3")],
                      n_tasks=10, n_samples=8)
    for name, r in result.items():
        assert r["passk"] >= r["pass1"] + 0.2, (name, r)
        assert r["greedy"] >= 0.8, (name, r)
        assert r["infra_errors"] == 0


def test_stop_check_without_piecewise_decoding_agrees(policy, monkeypatch):
    """Tokenizers whose lone tokens do not decode to the same text (SentencePiece) take the
    windowed-decode path of the stop check; it must stop at the same place."""
    requests = [req(p, temperature=1.0, max_tokens=12, stop=("\n", "c"), seed=i) for i, p in enumerate(PROMPTS)]
    fast = policy.generate(requests)
    monkeypatch.setattr(policy, "_piecewise", False)
    windowed = policy.generate(requests)
    assert [(c.text, c.token_ids, c.finish_reason) for c in fast] == \
           [(c.text, c.token_ids, c.finish_reason) for c in windowed]


@pytest.mark.parametrize("use_cache", [True, False])
def test_generation_builds_no_autograd_graph(policy, monkeypatch, use_cache):
    """Decoding runs without autograd (a graph kept every step's activations alive: ~9x the memory
    of a batch of long prompts, and ~1.7x the CPU), even in a thread where gradients are on."""
    seen: list[tuple[bool, bool]] = []

    def hook(module, args, output):
        logits = output.logits
        seen.append((torch.is_grad_enabled(), logits.requires_grad))

    monkeypatch.setattr(policy, "use_cache", use_cache)
    handle = policy.model.register_forward_hook(hook)
    try:
        with torch.enable_grad():
            out = policy.generate([req(p, temperature=1.0, max_tokens=6, seed=1) for p in PROMPTS])
    finally:
        handle.remove()
    assert all(c.finish_reason in ("stop", "length") for c in out)
    assert seen and not any(grad or needs for grad, needs in seen)
