"""Smoke: the RL recipe runs end to end (base eval, two short rounds, evals) and keeps lineage."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from posttrain.policies.local import TorchPolicy
from posttrain.training.recipe import RecipeConfig, main, parse_args

MODEL = Path(__file__).resolve().parents[1] / "models" / "tiny-base"


@pytest.mark.slow
def test_recipe_smoke(tmp_path, capsys):
    cfg = RecipeConfig(model=str(MODEL), out=str(tmp_path), mix="math.add.d2,text.reverse.l3",
                       held_out="text.upper.l3", rounds=2, steps=2, prompts_per_step=4, group_size=4,
                       eval_tasks=3, eval_samples=2, threads=1)
    result = main(cfg)
    torch.set_num_threads(1)
    assert [r["round"] for r in result["rounds"]] == [1, 2]
    assert set(result["evals"]) == {"base", "round-1", "round-2"}
    assert set(result["evals"]["base"]) == {"math.add.d2", "text.reverse.l3", "text.upper.l3"}
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert last["rounds"][1]["steps"] == 2
    round2 = TorchPolicy(tmp_path / "round-2", device="cpu")
    assert (round2.version.name, round2.version.parent) == ("round-2/step-2", "round-1/step-2")
    assert json.loads((tmp_path / "recipe.json").read_text())["config"]["steps"] == 2


def test_recipe_flags_map_to_config_fields():
    cfg = parse_args(["--steps", "7", "--lr", "1e-4", "--mix", "math.add.d1", "--no-adaptive"])
    assert (cfg.steps, cfg.lr, cfg.mix, cfg.adaptive) == (7, 1e-4, "math.add.d1", False)
    assert parse_args([]).adaptive is True
