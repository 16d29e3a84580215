"""`VisionPolicy` token-in/token-out and prefix/KV reuse (tiny random LLaVA, `tests/tiny_vlm.py`):
the next turn's prompt extends the previous prompt + completion ids as sampled, a cached prefix
is reused across turns with the same output as computing it all, and the cache never lends one
picture's keys/values to a prompt with another picture at the same ids."""

from __future__ import annotations

import pytest

from posttrain.policies.vision import VisionPolicy
from posttrain.policies.vision_decode import image_key, key_ids, reusable
from posttrain.tasks.registry import get_domain
from posttrain.values.generation import GenerationRequest, Message, SamplingParams
from posttrain.values.image import parts
from tests.tiny_vlm import IMAGE_POSITIONS, tiny_vlm

GREEDY = SamplingParams(temperature=0, max_tokens=6)


@pytest.fixture(scope="module")
def vlm() -> VisionPolicy:
    return tiny_vlm()


@pytest.fixture(scope="module")
def charts():
    chart = get_domain("docs.chart.peak.bar")
    return [chart.images(chart.task(s))[0] for s in range(3)]


def _turn2(first: GenerationRequest, prompt_ids, completion_ids, answer: str, image) -> GenerationRequest:
    messages = first.messages + (Message("assistant", answer), Message("user", parts("and this one?", [image])))
    return GenerationRequest(messages, GREEDY, prefix_ids=tuple(prompt_ids) + tuple(completion_ids),
                             prefix_messages=len(first.messages) + 1)


def test_the_next_turn_extends_the_sampled_ids_and_is_never_re_tokenized(vlm, charts):
    first = GenerationRequest((Message("user", parts("which quarter?", [charts[0]])),), GREEDY)
    prompt = vlm.render(first)
    # a completion as sampled that its text does not give back: it ends with EOS (and text never holds EOS)
    eos = vlm.tokenizer.eos_token_id
    sampled = vlm.tokenizer("Q3", add_special_tokens=False)["input_ids"] + [eos]
    second = _turn2(first, prompt, sampled, "Q3", charts[1])
    ids = vlm.render(second)
    assert ids[:len(prompt) + len(sampled)] == prompt + sampled
    tail = ids[len(prompt) + len(sampled):]
    assert tail.count(vlm.model.config.image_token_index) == IMAGE_POSITIONS  # the new image, expanded
    assert vlm._text(tail).startswith("\nand this one?")
    whole = vlm.render(GenerationRequest(second.messages, GREEDY))  # what re-rendering would give
    assert whole != ids and eos not in whole
    # the model completes exactly those ids
    (done,) = vlm.generate([second])
    assert done.prompt_token_ids == ids


def test_a_cached_turn_is_reused_and_completes_as_computed_in_full(vlm, charts):
    cached = VisionPolicy(vlm.model, vlm.processor, prefix_cache_mb=16)
    first = GenerationRequest((Message("user", parts("which quarter?", [charts[0]])),), GREEDY)
    (a_cold,), (a_ref,) = cached.generate([first]), vlm.generate([first])
    assert a_cold.reused_tokens == 0 and a_cold.token_ids == a_ref.token_ids
    second = _turn2(first, a_cold.prompt_token_ids, a_cold.token_ids, a_cold.text, charts[1])
    (b,), (b_ref,) = cached.generate([second]), vlm.generate([second])
    history = len(a_cold.prompt_token_ids) + len(a_cold.token_ids)
    # every token whose keys/values turn 1 computed (prompt + completion but its last token) is reused
    assert b.reused_tokens == history - 1 and b.prefill_tokens == len(b.prompt_token_ids) - b.reused_tokens
    assert b.prompt_token_ids == b_ref.prompt_token_ids
    assert b.token_ids == b_ref.token_ids and b.text == b_ref.text
    assert max(abs(x - y) for x, y in zip(b.logprobs, b_ref.logprobs)) < 1e-4
    assert cached.prefix_cache is not None and cached.prefix_cache.hits >= 1


def test_the_same_text_with_another_picture_never_shares_its_keys_and_values(vlm, charts):
    cached = VisionPolicy(vlm.model, vlm.processor, prefix_cache_mb=16)
    ra, rb = (GenerationRequest((Message("user", parts("which quarter had the peak?", [img])),
                                 Message("user", "answer:")), GREEDY) for img in charts[:2])
    ids = vlm.render(ra)
    assert ids == vlm.render(rb)  # identical ids: only the pictures differ
    image_at = ids.index(vlm.model.config.image_token_index)
    (a,) = cached.generate([ra])
    (b,), (b_ref,) = cached.generate([rb]), vlm.generate([rb])
    assert b.reused_tokens <= image_at  # at most the text before the picture
    assert b.token_ids == b_ref.token_ids
    assert max(abs(x - y) for x, y in zip(b.logprobs, b_ref.logprobs)) < 1e-4
    (again,) = cached.generate([ra])  # the same picture again: everything up to the last token is reused
    assert again.reused_tokens == len(ids) - 1 and again.token_ids == a.token_ids


def test_a_group_of_one_prompt_with_its_picture_is_computed_once(vlm, charts):
    cached = VisionPolicy(vlm.model, vlm.processor, prefix_cache_mb=16)
    requests = [GenerationRequest((Message("user", parts("which quarter?", [charts[i % 2]])),),
                                  SamplingParams(temperature=1.0, seed=i, max_tokens=5)) for i in range(4)]
    got, want = cached.generate(requests), vlm.generate(requests)
    for g, w in zip(got, want):  # rows 0/2 and 1/3 share a prompt pass, each with its own picture
        assert g.token_ids == w.token_ids
        assert max(abs(x - y) for x, y in zip(g.logprobs, w.logprobs)) < 1e-4


def test_key_ids_put_each_pictures_hash_at_its_positions(charts):
    a, b = charts[:2]
    ids = [1, 5, 9, 9, 9, 6, 9, 9, 7]
    keys, spans = key_ids(ids, [a, b], [3, 2], {9})
    assert keys == [1, 5, image_key(a), image_key(a), image_key(a), 6, image_key(b), image_key(b), 7]
    assert spans == [(2, 5), (6, 8)] and image_key(a) != image_key(b) and image_key(a) < 0
    assert reusable(4, spans) == 2 and reusable(5, spans) == 5 and reusable(7, spans) == 6
    with pytest.raises(ValueError, match="holds 5 image positions, its 2 image"):
        key_ids(ids, [a, b], [3, 3], {9})
    with pytest.raises(ValueError, match="prefix_cache_mb"):
        VisionPolicy(tiny_vlm().model, tiny_vlm().processor, prefix_cache_mb=-1)
