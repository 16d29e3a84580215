"""Paired A/B comparisons, baselines gating both ways, forgetting reports."""

import json

import pytest
from typer.testing import CliRunner

from posttrain.cli import app as root_app
from posttrain.evaluation import EvalConfig, compare, forgetting_report, resolve_tasks, run_eval
from posttrain.evaluation.baseline import Baseline, create_baseline, gate
from posttrain.evaluation.forgetting import write_forgetting
from posttrain.policies.scripted import ScriptedPolicy
from tests.test_eval_support import CoinPolicy

runner = CliRunner()
DOMS = "math.add.d3,math.sub.d3,text.reverse.l5"


@pytest.fixture(scope="module")
def tasks():
    return resolve_tasks(DOMS, per_domain=40)


def test_identical_policies_show_no_difference(tasks):
    cfg = EvalConfig(k=(1, 4))
    a = run_eval(CoinPolicy(0.6, "a"), tasks, cfg)
    b = run_eval(CoinPolicy(0.6, "b"), tasks, cfg)
    rep = compare(a, b)
    assert rep.regressions == [] and rep.overall["diff"] == 0.0 and rep.overall["mcnemar_p"] == 1.0
    assert all(v["a_only"] == v["b_only"] == 0 for v in rep.domains.values())
    assert rep.overall["pairs"] == 3 * 40 * 4 and rep.warnings == []


def test_planted_regression_is_flagged_only_where_it_is(tasks):
    cfg = EvalConfig(k=(1, 4))
    a = run_eval(CoinPolicy(0.8, "a"), tasks, cfg)
    b = run_eval(CoinPolicy({"math.add.d3": 0.8, "math.sub.d3": 0.3, "text.reverse.l5": 0.8}, "b"), tasks, cfg)
    rep = compare(a, b)
    sub = rep.domains["math.sub.d3"]
    assert sub["regression"] and sub["diff"] < -0.3 and sub["ci"][1] < 0 and sub["p_holm"] < 1e-6
    assert not rep.domains["math.add.d3"]["significant"] and not rep.domains["text.reverse.l5"]["significant"]
    # same seeds: where both policies use the same p, every pair agrees
    assert rep.domains["math.add.d3"]["a_only"] == rep.domains["math.add.d3"]["b_only"] == 0
    assert "math.sub.d3" in rep.regressions
    # the other direction is an improvement, never a regression
    back = compare(b, a)
    assert back.domains["math.sub.d3"]["improvement"] and back.regressions == []


def test_small_differences_are_not_significant(tasks):
    few = tasks[:6]
    a = run_eval(CoinPolicy(0.5, "a"), few, EvalConfig(k=(1,), seed=1))
    b = run_eval(CoinPolicy(0.5, "b"), few, EvalConfig(k=(1,), seed=2))   # different seeds: noise
    rep = compare(a, b)
    assert rep.regressions == [] and any("seed differs" in w for w in rep.warnings)


def test_compare_needs_common_tasks(tasks):
    a = run_eval(ScriptedPolicy.named("oracle"), tasks[:3], EvalConfig())
    b = run_eval(ScriptedPolicy.named("oracle"), tasks[-3:], EvalConfig())
    with pytest.raises(ValueError, match="no task has a scored sample on both sides"):
        compare(a, b)


def test_baseline_gates_both_ways(tmp_path, tasks):
    base = create_baseline(ScriptedPolicy.named("oracle"), tasks, 24, EvalConfig(k=(1, 2)))
    assert len(base.tasks) == 24 and {d.name for d, _ in base.tasks} == set(DOMS.split(","))
    path = base.save(tmp_path / "base.json")
    loaded = Baseline.load(path)
    assert [t.hash for _, t in loaded.tasks] == [t.hash for _, t in base.tasks]
    ok = gate(loaded, ScriptedPolicy.named("oracle"))
    assert ok.passed and ok.lines()[-1] == "no significant regression"
    bad = gate(loaded, ScriptedPolicy.named("wrong"))
    assert not bad.passed and set(bad.report.regressions) == set(DOMS.split(",")) | {"overall"}
    assert any(line.startswith("REGRESSION math.sub.d3") for line in bad.lines())
    # the CLI exits non-zero on a regression and says where
    res = runner.invoke(root_app, ["eval", "--policy", "wrong", "--baseline", str(path)])
    assert res.exit_code == 1 and "REGRESSION text.reverse.l5" in res.output
    res = runner.invoke(root_app, ["eval", "--policy", "oracle", "--baseline", str(path), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["passed"] is True


def test_baseline_file_errors_name_file_and_field(tmp_path):
    p = tmp_path / "b.json"
    p.write_text(json.dumps({"format": "posttrain.baseline/1", "tasks": []}))
    with pytest.raises(ValueError, match="b.json: missing field 'result'"):
        Baseline.load(p)
    p.write_text("[]")
    with pytest.raises(ValueError, match="b.json: field 'format'"):
        Baseline.load(p)
    res = runner.invoke(root_app, ["eval", "--policy", "oracle", "--baseline", str(tmp_path / "none.json")])
    assert res.exit_code == 2 and "no such baseline file" in res.output


def test_forgetting_report_flags_held_out_drops(tmp_path, tasks):
    cfg = EvalConfig(k=(1, 4))
    before = run_eval(CoinPolicy(0.7, "base"), tasks, cfg, name="before")
    after = run_eval(CoinPolicy({"math.add.d3": 0.95, "math.sub.d3": 0.7, "text.reverse.l5": 0.2}, "r1"),
                     tasks, cfg, name="after")
    rep = forgetting_report(before, after, trained_domains="math.add.*")
    assert set(rep["trained"]) == {"math.add.d3"} and rep["trained"]["math.add.d3"]["delta"] > 0.1
    assert set(rep["held_out"]) == {"math.sub.d3", "text.reverse.l5"}
    assert rep["forgotten"] == ["text.reverse.l5"] and rep["held_out"]["math.sub.d3"]["delta"] == 0.0
    assert rep["held_out"]["text.reverse.l5"]["paired"] and rep["held_out_mean_delta"] < 0
    path = write_forgetting(tmp_path, rep, "round-1")
    assert json.loads(path.read_text())["forgotten"] == ["text.reverse.l5"]
    # different tasks before and after: an unpaired (Newcombe) interval instead
    other = run_eval(CoinPolicy(0.2, "r2"), resolve_tasks("text.reverse.l5", per_domain=60)[40:], cfg)
    unpaired = forgetting_report(before, other, trained_domains=[])
    row = unpaired["held_out"]["text.reverse.l5"]
    assert not row["paired"] and row["significant_drop"] and row["ci"][0] < row["delta"] < row["ci"][1] < 0
    assert unpaired["only_before"] == ["math.add.d3", "math.sub.d3"]
