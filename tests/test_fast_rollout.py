"""Fast mode where rollouts are made: `posttrain rollout --mode fast` and the run job's sampling
policy (`[rollout] mode`, through `PolicyPublisher`) give standard decoding's greedy output."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner

from posttrain.cli import app

MODEL = Path(__file__).resolve().parents[1] / "models" / "tiny-base"
runner = CliRunner()


def _rollout(tmp_path: Path, *args: str) -> list[tuple]:
    run_dir = tmp_path / "run"
    result = runner.invoke(app, ["rollout", "--domains", "math.add.d1,text.reverse.l3", "--n", "3",
                                 "--run-dir", str(run_dir), "--json", "--max-infra-rate", "1", *args])
    assert result.exit_code == 0, result.output
    counts = json.loads([line for line in result.output.splitlines() if line.startswith("{")][-1])
    assert counts["episodes"] == 6 and counts["infra_error"] == 0, counts
    db = sqlite3.connect(run_dir / "store.sqlite")
    rows = db.execute("SELECT t.task_key, u.body FROM trajectories t JOIN turns u ON u.trajectory_id = t.id "
                      "ORDER BY t.task_key, u.idx").fetchall()
    meta = db.execute("SELECT config FROM runs").fetchall()
    db.close()
    assert any(json.loads(m)["mode"] == args[args.index("--mode") + 1] for (m,) in meta if m)
    return [(key, json.loads(body)["token_ids"], json.loads(body)["action"]) for key, body in rows]


@pytest.mark.slow
def test_a_fast_rollout_gives_standard_greedy_output(tmp_path):
    greedy = ("--policy", str(MODEL), "--temperature", "0", "--max-tokens", "12")
    standard = _rollout(tmp_path / "s", *greedy, "--mode", "standard")
    fast = _rollout(tmp_path / "f", *greedy, "--mode", "fast")
    assert len(standard) == 6 and all(ids for _, ids, _ in standard)
    assert fast == standard


def test_fast_mode_needs_a_model(tmp_path):
    result = runner.invoke(app, ["rollout", "--policy", "oracle", "--mode", "fast", "--domains", "math.add.d1",
                                 "--run-dir", str(tmp_path)])
    assert result.exit_code == 2 and "--mode fast needs a model directory as --policy, not 'oracle'" in result.output
    result = runner.invoke(app, ["rollout", "--policy", str(MODEL), "--mode", "turbo", "--domains", "math.add.d1",
                                 "--run-dir", str(tmp_path)])
    assert result.exit_code == 2 and "--mode must be 'standard' or 'fast', got 'turbo'" in result.output


@pytest.mark.slow
@pytest.mark.parametrize("copy", [False, True])
def test_the_jobs_sampler_runs_in_the_configured_mode_and_follows_the_weights(copy):
    import torch

    from posttrain.training.config import TrainerConfig
    from posttrain.training.publish import PolicyPublisher
    from posttrain.training.trainer import Trainer
    from posttrain.values.generation import GenerationRequest, Message, SamplingParams

    trainer = Trainer(MODEL, TrainerConfig(run_name="p"))
    fast = PolicyPublisher(trainer, copy=copy, mode="fast")
    standard = PolicyPublisher(trainer, copy=copy)
    assert fast._policy.mode == "fast" and standard._policy.mode == "standard"
    requests = [GenerationRequest((Message("user", f"reverse abc{c}=cba\nreverse abc{c}="),),
                                  SamplingParams(temperature=0.0, max_tokens=10)) for c in "xyz"]

    def ids(publisher: PolicyPublisher) -> list[list[int]]:
        return [c.token_ids for c in publisher.generate(requests)]

    before = ids(standard)
    assert ids(fast) == before
    with torch.no_grad():  # as an optimizer step: the sampler must not decode from stale keys/values
        torch.manual_seed(0)
        for p in trainer.model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    trainer.step_count = 1
    fast.publish(), standard.publish()
    after = ids(standard)
    assert after != before and ids(fast) == after
    assert fast._policy.mode == "fast"


AGENT = MODEL.parent / "tiny-agent"


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["standard", "fast"])
def test_stored_turns_say_how_much_of_their_prompt_was_reused(tmp_path, mode):
    from posttrain.storage.store import Store

    run_dir = tmp_path / "run"
    result = runner.invoke(app, ["rollout", "--policy", str(AGENT), "--mode", mode, "--temperature", "0",
                                 "--max-tokens", "48", "--domains", "terminal.count.words", "--n", "1",
                                 "--run-dir", str(run_dir), "--json", "--max-infra-rate", "0"])
    assert result.exit_code == 0, result.output
    with Store.for_run_dir(run_dir, readonly=True) as store:
        [traj] = list(store.trajectories())
    assert traj.status == "completed" and len(traj.turns) >= 2  # a tool call, then the answer
    for t in traj.turns:
        assert t.prefill_tokens + t.reused_tokens == len(t.prompt_token_ids or [])
    first, second = traj.turns[:2]
    assert first.reused_tokens == 0
    if mode == "fast":  # turn 2 extends turn 1's prompt: the cache holds at least that much
        assert second.reused_tokens >= len(first.prompt_token_ids or [])
    else:
        assert second.reused_tokens == 0


def test_turns_stored_before_the_cache_figures_load_with_zeros():
    from posttrain.values.trajectory import Trajectory

    old = {"task_key": "k", "task_hash": "h", "domain": "d", "split": "train", "policy_version": "v",
           "status": "completed", "reward": 1.0,
           "turns": [{"index": 0, "observation": "o", "action": "a", "gen_s": 0.1}]}
    [turn] = Trajectory.from_dict(old).turns
    assert (turn.prefill_tokens, turn.reused_tokens) == (0, 0)
    again = Trajectory.from_dict(Trajectory.from_dict(old).to_dict())
    assert again.turns[0].prefill_tokens == 0 and "reused_tokens" in again.to_dict()["turns"][0]
