"""The context policy: an episode that outgrows its context budget either ends ('end') or drops
its oldest tool observations ('drop_oldest_tool_output'), keeping the instruction, the last
observations and every action's sampled ids; the drops are recorded and replayed identically."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace

import pytest
from typer.testing import CliRunner

from posttrain.cli import app
from posttrain.envs import EnvConfig
from posttrain.envs.budget import KEEP_LAST_OBSERVATIONS, dropped_marker, plan_drops
from posttrain.pipeline.config import RolloutSection
from posttrain.policies.local import TorchPolicy
from posttrain.rollout.episode import Episode
from posttrain.scheduling.replay import replay
from posttrain.storage.store import Store
from posttrain.tasks.registry import get_domain
from posttrain.values.generation import Completion, GenerationRequest, PolicyVersion, SamplingParams
from posttrain.values.trajectory import Trajectory


def action(turn: int) -> str:
    """long tool outputs (each a different one), then short ones; never a submit"""
    if turn < 5:
        return f"<bash>cat story.txt; seq {100 * turn} {100 * turn + 40}</bash>"
    return f"<bash>echo {turn}</bash>"


MAX_TURNS = 8


class CharIdsPolicy:
    """Plays `action(turn)` as one token id per character (non-canonical: re-tokenizing the
    text would give other ids), rendering prompts with a real tokenizer (`TorchPolicy.render`)."""

    def __init__(self, policy: TorchPolicy) -> None:
        self.policy = policy
        self.version = PolicyVersion(name="char-ids")
        self.max_positions: int | None = None
        self.accepts_images = False
        self.requests: list[GenerationRequest] = []

    def action_ids(self, turn: int) -> list[int]:
        tok, text = self.policy.tokenizer, action(turn)
        ids = [tok(c, add_special_tokens=False)["input_ids"][0] for c in text]
        assert ids != tok(text, add_special_tokens=False)["input_ids"]
        return ids

    def render(self, request: GenerationRequest) -> list[int] | None:
        return self.policy.render(request)

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        self.requests += requests
        out = []
        for r in requests:
            ids = self.action_ids(int(r.meta["turn"]))
            out.append(Completion(text=action(int(r.meta["turn"])), finish_reason="stop",
                                  prompt_token_ids=self.render(r), token_ids=ids, logprobs=[0.0] * len(ids)))
        return out


def _episode(policy: CharIdsPolicy, context_policy: str, context_tokens: int) -> Trajectory:
    domain = get_domain("terminal.count.words")
    task = domain.task(0, "train")
    task = task.model_copy(update={"limits": task.limits.model_copy(
        update={"max_turns": MAX_TURNS, "context_tokens": context_tokens})})
    # the test tokenizer's tokens are short: estimate new observations conservatively
    config = EnvConfig(context_policy=context_policy, chars_per_token=1.0)  # type: ignore[arg-type]
    ep = Episode(domain, task, policy_version="char-ids", sampling=SamplingParams(max_tokens=48),
                 env_config=config)
    req = ep.start()
    while req is not None:
        req = ep.advance(policy.generate([req])[0])
    return ep.result().trajectory


def test_plan_drops_oldest_first_keeping_the_instruction_and_the_last_observations():
    sizes, markers = [50, 40, 5, 30, 60, 70], [8] * 6
    assert plan_drops(sizes, markers, [], 1) == [1]
    assert plan_drops(sizes, markers, [], 40) == [1, 3]  # 5 tokens is below its marker: kept
    assert plan_drops(sizes, markers, [1], 10) == [3]
    last = len(sizes) - KEEP_LAST_OBSERVATIONS
    assert plan_drops(sizes, markers, [], 10_000) == [1, 3]
    assert all(j < last for j in plan_drops(sizes, markers, [], 10_000))
    assert dropped_marker("x" * 1234) == "[output dropped: 1234 chars]"


def test_context_policy_is_validated_naming_the_field():
    with pytest.raises(ValueError, match="EnvConfig.context_policy"):
        EnvConfig(context_policy="drop_everything")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="context"):
        RolloutSection(context="drop_everything")  # type: ignore[arg-type]
    assert RolloutSection().context == "end"


@pytest.fixture(scope="module")
def tiny(bpe_model_dir):
    return TorchPolicy(bpe_model_dir, device="cpu")


def test_an_overflowing_episode_continues_by_dropping_and_replays_identically(tiny, tmp_path):
    policy = CharIdsPolicy(tiny)
    first = _episode(policy, "end", 4000)
    per_turn = len(first.turns[2].prompt_token_ids) - len(first.turns[1].prompt_token_ids)
    budget = len(first.turns[0].prompt_token_ids) + 4 * per_turn  # room for about four turns

    ended = _episode(policy, "end", budget)
    assert ended.counters.get("context_budget_exhausted") == 1 and len(ended.turns) < MAX_TURNS

    traj = _episode(policy, "drop_oldest_tool_output", budget)
    assert "context_budget_exhausted" not in traj.counters and len(traj.turns) == MAX_TURNS
    assert traj.counters["context_dropped_observations"] >= 1
    instruction = traj.turns[0].prompt_token_ids
    for k, turn in enumerate(traj.turns):
        assert len(turn.prompt_token_ids) + 48 <= budget  # every prompt fits, with a turn's room
        assert turn.prompt_token_ids[:len(instruction)] == instruction  # the instruction is kept
        assert set(turn.dropped_observations) <= set(range(1, k + 1 - KEEP_LAST_OBSERVATIONS))
        prev = traj.turns[k - 1] if k else None
        if prev is not None:
            assert set(prev.dropped_observations) <= set(turn.dropped_observations)
        text = tiny.tokenizer.decode(turn.prompt_token_ids)
        for j in turn.dropped_observations:
            assert dropped_marker(traj.turns[j].observation) in text
            assert traj.turns[j].observation not in text
        # every earlier action is in the prompt as its sampled (non-canonical) ids, in order
        ids, at = turn.prompt_token_ids, 0
        for i in range(k):
            act = policy.action_ids(i)
            at = next(n for n in range(at, len(ids)) if ids[n:n + len(act)] == act) + len(act)
        if prev is not None and prev.dropped_observations == turn.dropped_observations:
            # no new drop: token-in/token-out extends the previous prompt and completion
            history = prev.prompt_token_ids + prev.token_ids
            assert ids[:len(history)] == history
    dropping = [t for t in traj.turns if t.dropped_observations]
    assert dropping and dropping[0].index < MAX_TURNS - 1  # it dropped, then went on
    news = [len(t.dropped_observations) > len(p.dropped_observations) for p, t in zip(dropping, dropping[1:])]
    assert True in news and False in news  # later drops, and turns that extend a rebuilt prompt

    store = Store(tmp_path / "store.sqlite")
    domain = get_domain("terminal.count.words")
    task = domain.task(0, "train")
    task = task.model_copy(update={"limits": task.limits.model_copy(
        update={"max_turns": MAX_TURNS, "context_tokens": budget})})
    store.put_trajectory(traj, task)
    stored = store.get_trajectory(traj.id)
    config = EnvConfig(chars_per_token=1.0)  # the context policy comes from the recording
    result = replay(store, stored, env_config=config, render=tiny.render)
    assert result.matched, result.divergence
    store.close()
    # the same check from the command line (`--model`: the policy's tokenizer renders the prompts)
    out = CliRunner().invoke(app, ["replay", str(tmp_path), traj.id, "--model", str(tiny.path), "--json"])
    assert out.exit_code == 0, out.output[-600:]
    assert json.loads(out.stdout.strip().splitlines()[-1])["matched"] == 1
    store = Store(tmp_path / "store.sqlite")

    # the check can fail: a recording that claims other drops, or other prompt ids, diverges
    other = replace(stored, turns=[replace(t) for t in stored.turns])
    last = other.turns[-1]
    last.dropped_observations = last.dropped_observations[:-1]
    result = replay(store, other, env_config=config, render=tiny.render)
    assert not result.matched and result.divergence["field"] == "dropped_observations"
    other = replace(stored, turns=[replace(t) for t in stored.turns])
    other.turns[-1].prompt_token_ids = other.turns[-1].prompt_token_ids[:-1] + [3]
    result = replay(store, other, env_config=config, render=tiny.render)
    assert not result.matched and result.divergence["field"] == "prompt_token_ids"
