"""Multi-turn episodes in the trainer: one sequence per token-in/token-out episode, log-probs at
the model's own tokens only (per turn, in order), observations and tool output masked."""

from __future__ import annotations

import pytest
import torch

from posttrain.training.batch import samples_from, sequence_logprobs
from posttrain.values.trajectory import Trajectory, Turn


@pytest.fixture(scope="module")
def model():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=40, n_positions=128, n_embd=32, n_layer=2, n_head=2)).eval()


def episode(first: list[int], turns: list[tuple[list[int], list[int]]], reward: float = 1.0,
            extend: bool = True) -> Trajectory:
    """turns: (generated ids, observation ids that follow them); prompts built token-in/token-out
    (or, with extend=False, as a re-rendering backend would: the history's ids changed)."""
    out, prompt = [], list(first)
    for i, (gen, obs) in enumerate(turns):
        out.append(Turn(index=i, observation="", action="", prompt_token_ids=list(prompt), token_ids=list(gen),
                        logprobs=[-1.0 - 0.1 * j for j in range(len(gen))]))
        prompt = prompt + gen + obs
        if not extend:
            prompt = [(x + 1) % 40 for x in prompt]
    return Trajectory(task_key="k", task_hash="h", domain="d", split="train", policy_version="v",
                      status="completed", turns=out, reward=reward)


TURNS = [([5, 6, 7], [20, 21]), ([8, 9], [22, 23, 24]), ([10, 11, 12, 13], [])]


def test_a_token_in_token_out_episode_is_one_sample_of_its_generated_tokens(model):
    traj = episode([1, 2, 3, 4], TURNS)
    [whole], skipped = samples_from([traj], [0.5])
    assert skipped == 0
    assert whole.prompt_ids == [1, 2, 3, 4]
    assert whole.completion_ids == [5, 6, 7, 8, 9, 10, 11, 12, 13]  # the model's tokens only
    assert whole.turn_lengths == [3, 2, 4] and whole.between == [[20, 21], [22, 23, 24]]
    assert whole.old_logprobs == [lp for t in traj.turns for lp in t.logprobs]
    ids, mask = whole.tail()
    assert ids == [5, 6, 7, 20, 21, 8, 9, 22, 23, 24, 10, 11, 12, 13]
    assert [i for i, m in zip(ids, mask) if m] == whole.completion_ids

    per_turn, _ = samples_from([traj], [0.5], merge_turns=False)
    assert len(per_turn) == 3
    with torch.no_grad():
        merged_lp, _ = sequence_logprobs(model, [whole], temperature=1.0)
        turn_lp, _ = sequence_logprobs(model, per_turn, temperature=1.0)
    assert merged_lp.shape == (9,)  # observations get no log-prob: they are never trained
    torch.testing.assert_close(merged_lp, turn_lp, atol=1e-5, rtol=1e-5)


def test_observation_tokens_do_not_enter_the_loss(model):
    """Changing what a tool printed changes the context of later turns, never which tokens
    are trained: the log-probs of the first turn stay, and there are as many."""
    a = samples_from([episode([1, 2], TURNS)], [1.0])[0][0]
    other = [(g, [o + 1 for o in obs]) for g, obs in TURNS]
    b = samples_from([episode([1, 2], other)], [1.0])[0][0]
    with torch.no_grad():
        la, _ = sequence_logprobs(model, [a], temperature=1.0)
        lb, _ = sequence_logprobs(model, [b], temperature=1.0)
    assert la.shape == lb.shape
    torch.testing.assert_close(la[:3], lb[:3])
    assert not torch.allclose(la[3:], lb[3:])


def test_a_group_shares_its_first_prompt_and_matches_whole_sequences(model):
    group = [episode([1, 2, 3], TURNS), episode([1, 2, 3], [([7, 7], [30]), ([9], [])]),
             episode([1, 2, 3], [([4], [])])]
    samples, _ = samples_from(group, [1.0, -1.0, 0.0])
    assert [s.turn_lengths for s in samples] == [[3, 2, 4], [2, 1], None]
    with torch.no_grad():
        shared, _ = sequence_logprobs(model, samples, temperature=0.7, share_prompts=True)
        whole, _ = sequence_logprobs(model, samples, temperature=0.7, share_prompts=False)
    assert shared.shape == (9 + 3 + 1,)
    torch.testing.assert_close(shared, whole, atol=1e-5, rtol=1e-5)


def test_re_rendered_histories_fall_back_to_one_sample_per_turn(model):
    samples, _ = samples_from([episode([1, 2, 3], TURNS, extend=False)], [1.0])
    assert len(samples) == 3 and all(s.turn_lengths is None for s in samples)


def test_a_long_prompt_beside_a_long_tail_stays_inside_the_context(model):
    """Each sequence fits the model's 128 positions, but the longest prompt plus the longest
    tail does not: a short tail's padding must not count past the model's last position."""
    long_prompt = [1 + i % 30 for i in range(100)]
    long_tail = [([5 + i % 20 for i in range(20)], [21, 22] * 10)] * 2 + [([6, 7], [])]
    group = [episode(long_prompt, [([4, 5], [])]), episode(long_prompt, [([8], [])]),
             episode([1, 2], long_tail), episode([1, 2], [([3], [])])]
    samples, _ = samples_from(group, [1.0, -1.0, 1.0, -1.0])
    assert max(len(s.prompt_ids) for s in samples) + max(len(s.tail()[0]) for s in samples) > 128
    assert all(len(s.prompt_ids) + len(s.tail()[0]) <= 128 for s in samples)
    with torch.no_grad():
        shared, _ = sequence_logprobs(model, samples, temperature=1.0, share_prompts=True)
        whole, _ = sequence_logprobs(model, samples, temperature=1.0, share_prompts=False)
    torch.testing.assert_close(shared, whole, atol=1e-5, rtol=1e-5)
