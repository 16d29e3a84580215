"""Fast mode (speculative decoding) against standard decoding, on the shipped tiny model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from posttrain.policies.drafters import PromptLookup
from posttrain.policies.local import TorchPolicy
from posttrain.policies.ragged import RaggedBatch
from posttrain.policies.speculative import accept_sampled
from posttrain.values.generation import GenerationRequest, Message, SamplingParams

MODEL = Path(__file__).resolve().parents[1] / "models" / "tiny-base"
FAMILIES = ("text.reverse.l5", "text.double.l3", "math.add.d1", "math.max.d2", "code.str.reverse",
            "code.repair.str.rle", "terminal.text.uppercase", "terminal.files.concat")


def req(prompt: str, **sampling) -> GenerationRequest:
    return GenerationRequest((Message("user", prompt),), SamplingParams(**sampling))


def family_texts(n_seeds: int) -> list[str]:
    """Prompts and oracle transcripts of several families, cut to fit the 128-position model."""
    from posttrain.tasks.registry import get_domain

    texts = []
    for name in FAMILIES:
        domain = get_domain(name)
        for seed in range(n_seeds):
            task = domain.task(seed, "train")
            oracle = "\n".join(domain.oracle(task))
            texts.append(task.prompt[:30 + 7 * seed])
            texts.append(oracle[:20 + 9 * seed])
    return texts


@pytest.fixture(scope="module")
def standard() -> TorchPolicy:
    torch.set_num_threads(1)
    return TorchPolicy(MODEL, device="cpu")


@pytest.fixture(scope="module")
def fast(standard) -> TorchPolicy:
    return TorchPolicy(standard.model, standard.tokenizer, mode="fast", prefix_cache_mb=0)


@pytest.fixture(scope="module")
def random_draft(standard) -> torch.nn.Module:
    """A random one-layer GPT-2 with the same vocabulary: drafts badly, must change nothing."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=standard.model.config.vocab_size, n_positions=128, n_embd=32,
                     n_layer=1, n_head=2, activation_function="gelu")
    return GPT2LMHeadModel(cfg).eval()


def assert_same(a, b) -> None:
    for x, y in zip(a, b):
        assert (x.text, x.token_ids, x.finish_reason) == (y.text, y.token_ids, y.finish_reason)
        assert x.logprobs == pytest.approx(y.logprobs, abs=1e-4)


@pytest.mark.slow
def test_greedy_fast_is_standard_token_for_token_across_families(standard, fast):
    texts = family_texts(6)
    settings = [dict(max_tokens=48), dict(max_tokens=30, stop=("\n",)), dict(max_tokens=20, stop=("ba", ")"))]
    for s in settings:
        requests = [req(t, temperature=0.0, **s) for t in texts]
        before = fast.spec_stats.accepted
        assert_same(standard.generate(requests), fast.generate(requests))
        assert fast.spec_stats.accepted > before  # drafts were accepted: the fast path ran
    assert fast.spec_stats.acceptance_len > 1.3  # 96 rows: verify_tokens allows 1 draft per row per step


@pytest.mark.slow
def test_greedy_with_a_draft_model_is_standard(standard, random_draft):
    fast = TorchPolicy(standard.model, standard.tokenizer, mode="fast", draft=random_draft,
                       max_draft=4, prefix_cache_mb=0)
    requests = [req(t, temperature=0.0, max_tokens=30, stop=("\n",) if i % 2 else ())
                for i, t in enumerate(family_texts(3))]
    assert_same(standard.generate(requests), fast.generate(requests))
    assert fast.spec_stats.drafted > 0


def test_the_shipped_draft_model_drafts_for_tiny_base(standard):
    fast = TorchPolicy(standard.model, standard.tokenizer, mode="fast", prefix_cache_mb=0,
                       draft=MODEL.parent / "tiny-base-draft")
    requests = [req(t, temperature=0.0, max_tokens=24, stop=("\n",)) for t in family_texts(1)]
    assert_same(standard.generate(requests), fast.generate(requests))
    assert fast.spec_stats.accepted >= 0.3 * fast.spec_stats.drafted


@pytest.mark.slow
def test_a_batch_mixing_greedy_and_sampled_rows_keeps_greedy_rows_standard(standard, fast):
    texts = family_texts(2)
    greedy = [req(t, temperature=0.0, max_tokens=40) for t in texts]
    mixed = [r for g in greedy for r in (g, req("abcabcabc", temperature=1.0, max_tokens=40, seed=1))]
    out = fast.generate(mixed)
    assert_same(standard.generate(greedy), out[::2])


def teacher_forced(policy, prompt_ids, completion, temperature):
    ids = torch.tensor([prompt_ids + completion])
    with torch.no_grad():
        logits = policy.model(input_ids=ids).logits[0, len(prompt_ids) - 1:-1].float()
    return torch.log_softmax(logits / temperature, -1).gather(-1, torch.tensor(completion)[:, None]).flatten().tolist()


@pytest.mark.slow
@pytest.mark.parametrize("draft", [False, True])
def test_sampled_fast_logprobs_are_the_targets_and_seeds_reproduce(standard, random_draft, draft):
    fast = TorchPolicy(standard.model, standard.tokenizer, mode="fast", prefix_cache_mb=0,
                       draft=random_draft if draft else None)
    requests = [req(t, temperature=0.8, top_p=0.9, max_tokens=24, seed=i) for i, t in enumerate(family_texts(2))]
    a, b = fast.generate(requests), fast.generate(requests)
    assert [c.token_ids for c in a] == [c.token_ids for c in b]
    for c in a:
        assert c.logprobs == pytest.approx(teacher_forced(standard, c.prompt_token_ids, c.token_ids, 0.8), abs=1e-4)
        assert len(c.token_ids) <= 24 and (c.finish_reason == "stop" or len(c.token_ids) == 24)
    assert fast.spec_stats.accepted > 0


def test_max_tokens_stop_strings_and_the_context_limit_are_respected(standard, fast):
    prompt = "ab" * 50  # copy-heavy: long drafts, which must never run past any limit
    out = fast.generate([req(prompt, temperature=1.0, max_tokens=m, seed=m) for m in (1, 2, 3, 5, 9)])
    for m, c in zip((1, 2, 3, 5, 9), out):
        assert len(c.token_ids) <= m
        if c.finish_reason == "length":
            assert len(c.token_ids) == m
    [long] = fast.generate([req(prompt, temperature=0.0, max_tokens=100)])
    assert len(long.prompt_token_ids) + len(long.token_ids) == standard.max_positions
    assert long.finish_reason == "length"
    [std] = standard.generate([req(prompt, temperature=0.0, max_tokens=100)])
    assert std.token_ids == long.token_ids
    stop = long.text[3:6]  # a stop string the greedy completion reaches after drafts ran past it
    [cut] = fast.generate([req(prompt, temperature=0.0, max_tokens=60, stop=(stop,))])
    assert cut.text == long.text[:long.text.index(stop)] and cut.finish_reason == "stop"
    assert cut.token_ids == long.token_ids[:len(cut.text) + len(stop)]  # the stop string's tokens kept
    too_long = fast.generate([req("1" * 200, max_tokens=4), req("1+1=", temperature=0.0, max_tokens=4)])
    assert too_long[0].finish_reason == "error" and too_long[0].context_exceeded
    assert too_long[1].token_ids


@pytest.mark.slow
@pytest.mark.parametrize("one_hot", [True, False])
def test_rejection_sampling_follows_the_target_distribution(one_hot):
    """Chi-square on a 5-token vocabulary: the first and second emitted tokens follow p exactly,
    whatever the draft proposes (q one-hot on a fixed draft, or a draft sampled from q)."""
    from scipy.stats import chisquare

    p = torch.tensor([[0.05, 0.40, 0.25, 0.20, 0.10], [0.30, 0.10, 0.10, 0.45, 0.05],
                      [0.20, 0.20, 0.20, 0.20, 0.20]])
    q = torch.tensor([[0.60, 0.05, 0.05, 0.20, 0.10], [0.05, 0.05, 0.80, 0.05, 0.05]])
    gen = torch.Generator().manual_seed(0)
    n = 20000
    first, second = torch.zeros(5), torch.zeros(5)
    for _ in range(n):
        drafts = [0, 2] if one_hot else [int(torch.multinomial(q[i], 1, generator=gen)) for i in range(2)]
        accepted, nxt = accept_sampled(p * 3.0, drafts, None if one_hot else q, gen)  # unnormalised p
        emitted = drafts[:accepted] + [nxt]
        first[emitted[0]] += 1
        if accepted >= 1:  # the second token is drawn only when the first draft was accepted
            second[emitted[1]] += 1
    assert chisquare(first.numpy(), (p[0] * n).numpy()).pvalue > 1e-3
    # given the first token is draft[0], the second token still follows p[1]
    assert chisquare(second.numpy(), (p[1] * second.sum()).numpy()).pvalue > 1e-3
    # and the test has power: the draft's own distribution is rejected
    draft_q = torch.tensor([0.96, 0.01, 0.01, 0.01, 0.01]) if one_hot else q[0]
    assert chisquare(first.numpy(), (draft_q * n).numpy()).pvalue < 1e-6


@pytest.mark.slow
def test_sampled_fast_mode_matches_standard_mode_in_distribution(standard, fast):
    """End to end on the model: the first two tokens of 3000 samples, fast vs standard, by a
    two-sample chi-square (contingency) test. The prompt repeats, so drafts are proposed."""
    from scipy.stats import chi2_contingency

    prompt, n = "abcabcabcabcab", 3000
    counts = []
    for policy in (standard, fast):
        out = policy.generate([req(prompt, temperature=1.3, max_tokens=2, seed=i) for i in range(n)])
        pairs = [tuple(c.token_ids[:2]) for c in out]
        counts.append(pairs)
    keys = sorted(set(counts[0]) | set(counts[1]))
    table = [[pairs.count(k) for k in keys] for pairs in counts]
    common = [i for i, k in enumerate(keys) if table[0][i] + table[1][i] >= 20]
    rest = [sum(t[i] for i in range(len(keys)) if i not in common) for t in table]
    table = [[t[i] for i in common] + [r] for t, r in zip(table, rest)]
    assert len(common) >= 3
    assert chi2_contingency(table).pvalue > 1e-3


def test_prompt_lookup_copies_the_latest_match_and_through_its_own_draft():
    d = PromptLookup(max_ngram=3, min_ngram=1)
    d.start([[5, 6, 7, 8, 9, 5, 6]], [0.0], [1.0], [None])
    assert d.draft(0, 3) == [7, 8, 9]
    d.commit(0, 0, [7])
    assert d.draft(0, 2) == [8, 9]
    d.start([[1, 2, 3, 1, 2]], [0.0], [1.0], [None])
    assert d.draft(0, 7) == [3, 1, 2, 3, 1, 2, 3]  # a repeating pattern drafts in full
    d.start([[1, 2, 3]], [0.0], [1.0], [None])
    assert d.draft(0, 4) == []


def test_ragged_rows_compute_what_they_would_alone(standard):
    """Rows feeding different chunk lengths, retracting drafts and being compacted still get
    the logits of a plain forward over their own real tokens."""
    model = standard.model
    seqs = [[1, 40, 41, 42, 43], [1, 50, 51], [1, 60, 61, 62, 63, 64, 65]]
    batch = RaggedBatch(model, standard.pad_id, [([], None)] * 3)
    batch.forward(seqs)
    batch.forward([[70, 71, 72], [73], [74, 75]])
    batch.retract(0, 2)  # row 0 keeps 70 only
    batch.retract(2, 1)  # row 2 keeps 74 only
    batch.compact(slack=0.0)
    logits, lengths = batch.forward([[80], [81, 82], [83]])
    full = [seqs[0] + [70, 80], seqs[1] + [73, 81, 82], seqs[2] + [74, 83]]
    for r, seq in enumerate(full):
        with torch.no_grad():
            alone = model(input_ids=torch.tensor([seq])).logits[0, -lengths[r]:]
        assert torch.allclose(logits[r, -lengths[r]:], alone, atol=1e-4)
        assert batch.fed[r] == seq
        assert batch.row_kv(r)[0][0].shape[-2] == len(seq)


def test_bad_settings_are_clear_errors(standard):
    with pytest.raises(ValueError, match="mode must be one of"):
        TorchPolicy(standard.model, standard.tokenizer, mode="turbo")
    with pytest.raises(ValueError, match="use_cache"):
        TorchPolicy(standard.model, standard.tokenizer, mode="fast", use_cache=False)
    with pytest.raises(ValueError, match="only used with mode='fast'"):
        TorchPolicy(standard.model, standard.tokenizer, draft=standard.model)
    from transformers import GPT2Config, GPT2LMHeadModel
    other = GPT2LMHeadModel(GPT2Config(vocab_size=50, n_positions=128, n_embd=16, n_layer=1, n_head=1))
    with pytest.raises(ValueError, match="vocabulary size"):
        TorchPolicy(standard.model, standard.tokenizer, mode="fast", draft=other)


def test_eval_resolves_a_model_directory_in_fast_mode_and_refuses_it_elsewhere():
    from posttrain.evaluation.policy import PolicySpecError, resolve_policy

    assert resolve_policy(str(MODEL), mode="fast").mode == "fast"
    assert resolve_policy(str(MODEL)).mode == "standard"
    with pytest.raises(PolicySpecError, match="needs a model directory"):
        resolve_policy("oracle", mode="fast")
    with pytest.raises(PolicySpecError, match="expected 'standard' or 'fast'"):
        resolve_policy(str(MODEL), mode="turbo")


@pytest.mark.slow
def test_a_draft_model_never_drafts_past_the_context(standard, random_draft):
    fast = TorchPolicy(standard.model, standard.tokenizer, mode="fast", draft=random_draft, prefix_cache_mb=0)
    prompts = ["ab" * 50, "abc" * 40, "x" * 120, "1+1="]  # rows reach the 128-position limit at different steps
    for temperature in (0.0, 1.0):
        requests = [req(p, temperature=temperature, max_tokens=100, seed=i) for i, p in enumerate(prompts)]
        out = fast.generate(requests)
        for c in out:
            assert len(c.prompt_token_ids) + len(c.token_ids) <= standard.max_positions
        if temperature == 0.0:
            assert_same(standard.generate(requests), out)
