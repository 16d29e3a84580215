"""`posttrain eval`, `eval compare`, `eval baseline create` through the real CLI."""

import json
import subprocess
import sys

from typer.testing import CliRunner

from posttrain.cli import app as root_app
from posttrain.evaluation import EvalResult
from posttrain.storage.store import Store

runner = CliRunner()
TASKS = "math.add.d2,text.upper.l3"


def invoke(*args):
    return runner.invoke(root_app, list(args))


def test_eval_json_and_run_dir(tmp_path):
    res = invoke("eval", "--policy", "oracle", "--tasks", TASKS, "--per-domain", "4", "--k", "1,2",
                 "--run-dir", str(tmp_path), "--name", "base", "--json")
    assert res.exit_code == 0, res.output
    body = json.loads(res.output)
    assert {"domains", "macro_pass1", "micro_pass1", "infra_error_rate"} <= set(body)
    assert body["macro_pass1"] == 1.0 and body["domains"]["math.add.d2"]["pass@2"]["value"] == 1.0
    saved = EvalResult.load(tmp_path / "evals" / "base.json")
    assert saved.summary["episodes"] == 16 and saved.policy == "scripted:oracle"
    with Store.for_run_dir(tmp_path) as store:
        assert store.counts("eval:base")["episodes"] == 16
    table = invoke("eval", "--policy", "wrong", "--tasks", TASKS, "--per-domain", "2")
    assert table.exit_code == 0 and "math.add.d2" in table.output and "macro pass@1 0.0%" in table.output


def test_eval_bad_arguments_are_named():
    for args, needle in [(["--policy", "nosuch"], "names nothing loadable"),
                         (["--policy", "oracle", "--k", "0"], "--k must be"),
                         (["--policy", "oracle", "--tasks", "nosuch.*"], "--tasks: no domain matches"),
                         (["--tasks", TASKS], "--policy is required"),
                         (["--policy", "oracle", "--ci", "normal"], "--ci: Input should be 'wilson' or 'bootstrap'")]:
        res = invoke("eval", *args)
        assert res.exit_code == 2 and needle in res.output, (args, res.output)


def test_compare_runs_or_loads_both_sides(tmp_path):
    assert invoke("eval", "--policy", "oracle", "--tasks", TASKS, "--per-domain", "10", "--run-dir",
                  str(tmp_path), "--name", "good").exit_code == 0
    # B is a policy run on exactly A's tasks and config; A is an eval name saved in --run-dir
    res = invoke("eval", "compare", "good", "wrong", "--run-dir", str(tmp_path), "--json", "--fail-on-regression")
    assert res.exit_code == 1, res.output
    body = json.loads(res.output)
    assert set(body["regressions"]) == {"math.add.d2", "text.upper.l3", "overall"}
    assert body["overall"]["pairs"] == 20 and list((tmp_path / "ab").glob("*.json"))
    both = invoke("eval", "compare", "oracle", "oracle", "--tasks", TASKS, "--per-domain", "3")
    assert both.exit_code == 0 and "REGRESSION" not in both.output
    files = invoke("eval", "compare", str(tmp_path / "evals" / "good.json"), str(tmp_path / "evals" / "good.json"),
                   "--json")
    assert files.exit_code == 0 and json.loads(files.output)["overall"]["diff"] == 0.0


def test_baseline_create_cli(tmp_path):
    out = tmp_path / "b.json"
    res = invoke("eval", "baseline", "create", "--policy", "oracle", "--tasks", TASKS, "--size", "10",
                 "--out", str(out), "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["tasks"] == 10
    res = invoke("eval", "--policy", "wrong", "--baseline", str(out))
    assert res.exit_code == 1 and "REGRESSION overall" in res.output
    too_many = invoke("eval", "baseline", "create", "--policy", "oracle", "--tasks", str(out), "--size", "50",
                      "--out", str(tmp_path / "c.json"))
    assert too_many.exit_code == 2 and "only 10 distinct tasks" in too_many.output


def test_cli_module_imports_nothing_heavy():
    code = ("import sys, posttrain.cli; bad = [m for m in ('torch', 'transformers', 'matplotlib', 'datasketch') "
            "if m in sys.modules]; print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr


def test_infra_errors_are_explained_per_domain():
    from posttrain.evaluation.cli import infra_error_causes
    from posttrain.evaluation.records import Sample, TaskRecord

    def rec(domain, errors):
        return TaskRecord(hash=domain, key=domain, domain=domain, family="x", env="single", split="eval",
                          seed=0, samples=[Sample(index=i, status="infra_error" if e else "completed",
                                                  passed=None if e else True, score=None, error=e)
                                           for i, e in enumerate(errors)])
    records = [rec("a", ["policy: RuntimeError: prompt of 300 tokens too long", None,
                         "policy: RuntimeError: prompt of 412 tokens too long", "sandbox: SandboxBroken: died"]),
               rec("b", [None, None])]
    assert infra_error_causes(records) == {"a": (2, "policy: RuntimeError: prompt of 300 tokens too long")}


def test_eval_threads_sets_torchs_cpu_threads_and_zero_leaves_them():
    import torch

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        res = invoke("eval", "--policy", "oracle", "--tasks", TASKS, "--per-domain", "1", "--json")
        assert res.exit_code == 0, res.output
        assert torch.get_num_threads() == 2  # the default, 0, leaves torch as it is
        res = invoke("eval", "--policy", "oracle", "--tasks", TASKS, "--per-domain", "1", "--threads", "1", "--json")
        assert res.exit_code == 0, res.output
        assert torch.get_num_threads() == 1
        assert invoke("eval", "--policy", "oracle", "--threads", "-1").exit_code == 2
    finally:
        torch.set_num_threads(before)
