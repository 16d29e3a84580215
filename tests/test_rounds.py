"""Rounds: forgetting is reported from the base model to round N, not only within a round."""

import json

import pytest

from posttrain.evaluation import forgetting_report
from posttrain.evaluation.forgetting import write_forgetting
from posttrain.pipeline.rounds import cumulative_forgetting, earlier_rounds
from tests.breadth_run import synthetic_eval

TASKS, SAMPLES = 40, 4


def _round(root, name, model, trained, evals):
    run = root / name
    (run / "checkpoints" / "step-2").mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"name": name, "model": {"path": str(model)}}))
    before, after = evals
    before.save_to_run(run)
    after.save_to_run(run)
    write_forgetting(run, forgetting_report(before, after, trained), name)
    return run


def _eval(name, policy, rates, t):
    return synthetic_eval(name, policy, rates, TASKS, SAMPLES, t)


@pytest.fixture
def three_rounds(tmp_path):
    # text.x is never trained and drifts down a little each round; math.a is trained in round 1 only
    base = {"math.a": 0.2, "math.b": 0.2, "text.x": 0.9}
    r1 = {"math.a": 0.8, "math.b": 0.2, "text.x": 0.75}
    r2 = {"math.a": 0.8, "math.b": 0.8, "text.x": 0.6}
    r3 = {"math.a": 0.5, "math.b": 0.8, "text.x": 0.45}
    one = _round(tmp_path, "r1", "models/tiny-base", ["math.a"],
                 (_eval("before", "base", base, 1), _eval("after", "r1/step-2", r1, 2)))
    two = _round(tmp_path, "r2", one / "checkpoints" / "step-2", ["math.b"],
                 (_eval("before", "r1/step-2", r1, 3), _eval("after", "r2/step-2", r2, 4)))
    this = (_eval("before", "r2/step-2", r2, 5), _eval("after", "r3/step-2", r3, 6))
    return tmp_path, two / "checkpoints" / "step-2", this


def test_the_chain_of_rounds_is_read_back_through_the_run_directories(three_rounds):
    root, model, _ = three_rounds
    earlier = earlier_rounds(model)
    assert [(r.name, r.trained) for r in earlier] == [("r1", ("math.a",)), ("r2", ("math.b",))]
    assert earlier_rounds("models/tiny-base") == []           # not a checkpoint: a first round
    assert earlier_rounds(root / "r1" / "checkpoints" / "step-2")[0].run_dir == root / "r1"


def test_cumulative_forgetting_sees_what_each_round_hides(three_rounds):
    _, model, (before, after) = three_rounds
    per_round = forgetting_report(before, after, ["math.c"])
    cumulative = cumulative_forgetting(earlier_rounds(model), "r3", after, ["math.c"])
    assert cumulative is not None and cumulative["rounds"] == ["r1", "r2", "r3"] and cumulative["cumulative"]
    assert cumulative["before"] == "r1/before" and cumulative["after"] == "r3/after"
    # within round 3 the never-trained domain loses ~0.15; since the base model, ~0.45
    within, since = per_round["held_out"]["text.x"], cumulative["held_out"]["text.x"]
    assert within["delta"] == pytest.approx(-0.15, abs=0.1)
    assert since["delta"] == pytest.approx(-0.45, abs=0.1) and since["delta"] < within["delta"] - 0.2
    assert "text.x" in cumulative["forgotten"]
    # math.a fell in round 3, but it was trained in round 1: not held out since the base model
    assert "math.a" in per_round["held_out"] and "math.a" in cumulative["trained"]
    assert set(cumulative["held_out"]) == {"text.x"}


def test_a_first_round_has_no_cumulative_report_and_a_broken_base_is_named(three_rounds, tmp_path):
    root, model, (_, after) = three_rounds
    assert cumulative_forgetting([], "r1", after, ["math.a"]) is None
    (root / "r1" / "evals" / "before.json").write_text("{")
    with pytest.raises(ValueError, match="r1/evals/before.json: not JSON"):
        cumulative_forgetting(earlier_rounds(model), "r3", after, [])
