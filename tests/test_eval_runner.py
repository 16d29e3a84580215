"""Running evaluations: scores, reproducible seeds, infra errors, records, files, task sets, policies."""

import json

import pytest

from posttrain.evaluation import EvalConfig, EvalResult, resolve_policy, run_eval
from posttrain.evaluation.policy import PolicySpecError
from posttrain.evaluation.records import Sample, TaskRecord
from posttrain.evaluation.summary import summarize
from posttrain.evaluation.tasksets import (
    TaskSetError,
    load_task_file,
    resolve_tasks,
    save_task_set,
    tasks_from_domains,
    tasks_of_records,
)
from posttrain.policies.scripted import ScriptedPolicy
from posttrain.storage.store import Store
from tests.test_eval_support import CoinPolicy, tool_trajectory
from tests.toydomains import CrashingVerifier, add_domain

SMALL = "math.add.d2,text.sort.l3"


def test_progress_counts_every_sample_once_up_to_the_total():
    tasks = resolve_tasks(SMALL, per_domain=3)
    seen: list[tuple[int, int]] = []
    run_eval(ScriptedPolicy.named("oracle"), tasks, EvalConfig(k=(1, 2)), on_progress=lambda f, t: seen.append((f, t)))
    assert seen == [(i, 12) for i in range(1, 13)]


def test_oracle_and_wrong_score_one_and_zero_with_cis():
    tasks = resolve_tasks(SMALL, per_domain=6)
    good = run_eval(ScriptedPolicy.named("oracle"), tasks, EvalConfig(k=(1, 2)))
    bad = run_eval(ScriptedPolicy.named("wrong"), tasks, EvalConfig(k=(1, 2)))
    for dom in ("math.add.d2", "text.sort.l3"):
        g, b = good.summary["domains"][dom], bad.summary["domains"][dom]
        assert g["pass@1"]["value"] == 1.0 and g["pass@2"]["value"] == 1.0 and g["episodes"] == 12
        assert 0.5 < g["pass@1"]["ci"][0] < 1.0 == g["pass@1"]["ci"][1]
        assert b["pass@1"]["value"] == 0.0 and b["pass@1"]["ci"][0] == 0.0 < b["pass@1"]["ci"][1]
        assert g["cost"]["tokens_estimated"] and g["latency_s"]["p50"] is not None and g["rework"] is None
    brief = good.brief()
    assert {"domains", "macro_pass1", "micro_pass1", "infra_error_rate", "families"} <= set(brief)
    assert brief["macro_pass1"] == 1.0 and brief["infra_error_rate"] == 0.0
    assert set(brief["families"]) == {"math", "text"} and brief["families"]["math"]["tasks"] == 6
    json.dumps(brief)  # plain JSON


def test_seeds_make_runs_reproducible_and_identical_across_task_orders():
    tasks = resolve_tasks("math.add.d3,text.reverse.l5", per_domain=8)
    cfg = EvalConfig(k=(1, 4), seed=7)
    a = run_eval(CoinPolicy(0.5), tasks, cfg)
    b = run_eval(CoinPolicy(0.5), list(reversed(tasks)), cfg)
    outcome = lambda r: {(t.hash, s.index): s.passed for t in r.records for s in t.samples}  # noqa: E731
    assert outcome(a) == outcome(b)
    passes = sum(outcome(a).values())
    assert 0 < passes < len(outcome(a))           # the coin really varies across samples
    other = run_eval(CoinPolicy(0.5), tasks, EvalConfig(k=(1, 4), seed=8))
    assert outcome(other) != outcome(a)


def test_seeded_policy_gives_every_turn_of_every_sample_its_own_seed():
    inner = CoinPolicy(0.5)
    run_eval(inner, resolve_tasks("math.add.d2", per_domain=5), EvalConfig(k=(3,)))
    assert None not in inner.seeds and len(set(inner.seeds)) == len(inner.seeds) == 15


def test_infra_errors_are_excluded_counted_and_retried(toy_registry):
    crash = add_domain("toy.crash", CrashingVerifier())
    ok = add_domain("toy.ok")
    toy_registry(crash, ok)
    tasks = [(crash, crash.task(i, "eval")) for i in range(3)] + [(ok, ok.task(i, "eval")) for i in range(3)]
    res = run_eval(ScriptedPolicy.named("oracle"), tasks, EvalConfig(k=(1,), retries=1))
    d = res.summary["domains"]["toy.crash"]
    assert d["pass@1"]["value"] is None and d["tasks_unscored"] == 3
    assert d["episodes"] == 6 and d["infra_errors"] == 6 and d["infra_error_rate"] == 1.0   # retried once
    assert res.summary["domains"]["toy.ok"]["pass@1"]["value"] == 1.0
    assert res.summary["macro_pass1"] == 1.0            # infra errors never count as failures
    assert res.summary["infra_error_rate"] == pytest.approx(6 / 9)
    sample = res.records[0].samples[0]
    assert sample.error.startswith("verifier: VerifierError") and sample.passed is None


def test_a_prompt_too_long_for_the_model_is_not_retried():
    from posttrain.values.generation import Completion, PolicyVersion

    class SmallContext:
        version = PolicyVersion("small")

        def generate(self, requests):
            return [Completion(text="", finish_reason="error", context_exceeded=True,
                               error="prompt of 99 tokens does not fit the model's maximum context length of 8 tokens")
                    for _ in requests]

    res = run_eval(SmallContext(), resolve_tasks("math.add.d2", per_domain=3), EvalConfig(k=(1,), retries=2))
    d = res.summary["domains"]["math.add.d2"]
    assert d["episodes"] == 3 and d["infra_errors"] == 3 and d["pass@1"]["value"] is None
    assert all(s.error.startswith("context: ") for r in res.records for s in r.samples)


def test_store_and_eval_file_roundtrip(tmp_path):
    tasks = resolve_tasks(SMALL, per_domain=3)
    with Store.for_run_dir(tmp_path) as store:
        res = run_eval(ScriptedPolicy.named("oracle"), tasks, EvalConfig(k=(1, 2)), name="base", store=store)
        assert store.counts("eval:base")["passed"] == 12
        assert {t.split for t in store.trajectories(run_id="eval:base")} == {"eval"}
        rebuilt = tasks_of_records(res.records, store)
    assert [t.hash for _, t in rebuilt] == [t.hash for _, t in tasks]
    path = res.save_to_run(tmp_path)
    assert path == tmp_path / "evals" / "base.json"
    back = EvalResult.load(path)
    assert back.summary == res.summary and back.config == res.config
    assert back.records[0].samples[0].trajectory_id == res.records[0].samples[0].trajectory_id
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "posttrain.eval/1", "name": "x", "policy": "p", "records": []}))
    with pytest.raises(ValueError, match="bad.json: missing field 'config'"):
        EvalResult.load(bad)
    bad.write_text(json.dumps({"format": "other"}))
    with pytest.raises(ValueError, match="field 'format'"):
        EvalResult.load(bad)


def test_summary_macro_micro_passk_and_rework_on_synthetic_records():
    def rec(domain, passes, env="single"):
        samples = [Sample(index=j, status="completed", passed=p, score=float(p)) for j, p in enumerate(passes)]
        return TaskRecord(hash=f"{domain}{passes}", key="k", domain=domain, family=domain.split(".")[0],
                          env=env, split="eval", seed=0, samples=samples)
    infra = Sample(index=2, status="infra_error", passed=None, score=None)
    big = [rec("a.x", [True, True])] * 3 + [rec("a.x", [False, False])]
    small = [rec("b.y", [True, False])]
    small[0].samples.append(infra)
    s = summarize(big + small, ks=(1, 2))
    assert s["domains"]["a.x"]["pass@1"]["value"] == 0.75
    assert s["domains"]["b.y"]["pass@1"]["value"] == 0.5 and s["domains"]["b.y"]["pass@2"]["value"] == 1.0
    assert s["macro_pass1"] == pytest.approx(0.625) and s["micro_pass1"] == pytest.approx(0.7)
    assert s["domains"]["b.y"]["infra_errors"] == 1 and s["infra_error_rate"] == pytest.approx(1 / 11)
    # a task with fewer scored samples than k is left out of pass@k, not counted as a failure
    short = rec("c.z", [True])
    assert summarize([short], ks=(2,))["domains"]["c.z"]["pass@2"] == {"value": None, "ci": None, "tasks": 0}

    trajs = [tool_trajectory(True, [[False], [True]]), tool_trajectory(True, [[True]]),
             tool_trajectory(False, [[False]]), tool_trajectory(None, [[True]])]
    samples = [Sample.from_trajectory(t, j) for j, t in enumerate(trajs)]
    assert samples[0].reworked and samples[0].runs == 2 and samples[0].failed_runs == 1 and samples[0].turns == 3
    assert not samples[1].reworked and samples[3].passed is None
    assert samples[0].sandbox_s == pytest.approx(0.375) and samples[0].tokens_estimated
    tools = TaskRecord(hash="t", key="t", domain="t.tools", family="t", env="tools", split="eval", seed=0,
                       samples=samples)
    rw = summarize([tools], ks=(1,))["domains"]["t.tools"]["rework"]
    assert rw == {"successes": 2, "rework_rate": 0.5, "turns_to_success": 2.5, "runs_to_success": 1.5}
    exact = Sample.from_trajectory(tool_trajectory(True, [[True]], prompt_ids=True), 0)
    assert (exact.prompt_tokens, exact.output_tokens, exact.tokens_estimated) == (12 + 20, 3 + 1, False)
    # without token ids: prompt = the context so far (observations + earlier actions) / 4 chars
    est = Sample.from_trajectory(tool_trajectory(True, [[True]]), 0)
    assert est.tokens_estimated and est.prompt_tokens == (30 // 4 + 1) + ((30 + 22 + 4) // 4 + 1)


def test_task_sets_from_globs_and_files(tmp_path):
    tasks = tasks_from_domains("math.add.d1", per_domain=40)
    assert len({t.hash for _, t in tasks}) == len(tasks) and {t.split for _, t in tasks} == {"eval"}
    path = save_task_set(tmp_path / "set.json", tasks[:5], name="five")
    assert [t.hash for _, t in resolve_tasks(str(path))] == [t.hash for _, t in tasks[:5]]
    jsonl = tmp_path / "tasks.jsonl"
    jsonl.write_text("\n".join(t.model_dump_json() for _, t in tasks[:3]) + "\n")
    assert len(load_task_file(jsonl)) == 3
    one = tmp_path / "one.json"
    one.write_text(tasks[0][1].model_dump_json())
    assert load_task_file(one)[0][1] == tasks[0][1]
    jsonl.write_text(tasks[0][1].model_dump_json() + "\n{not json\n")
    with pytest.raises(TaskSetError, match=r"tasks.jsonl:2: invalid JSON"):
        load_task_file(jsonl)
    one.write_text(json.dumps({"domain": "math.nosuch", "prompt": "1+1="}))
    with pytest.raises(TaskSetError, match="one.json: field 'domain': unknown domain 'math.nosuch'"):
        load_task_file(one)
    one.write_text(json.dumps({"domain": "math.add.d1", "prompt": 3}))
    with pytest.raises(TaskSetError, match="one.json: field 'prompt'"):
        load_task_file(one)
    with pytest.raises(TaskSetError, match="no domain matches"):
        resolve_tasks("nosuch.*")
    with pytest.raises(TaskSetError, match="no such task-set file"):
        resolve_tasks(str(tmp_path / "missing.json"))


def test_resolve_policy(tmp_path):
    assert resolve_policy("oracle").version.name == "scripted:oracle"
    assert resolve_policy("scripted:wrong").version.name == "scripted:wrong"
    with pytest.raises(PolicySpecError, match="expected 'openai:BASE_URL#MODEL'"):
        resolve_policy("openai:http://127.0.0.1:1/v1")
    with pytest.raises(PolicySpecError, match="base_url must be an http"):
        resolve_policy("openai:127.0.0.1:1/v1#tiny")
    served = resolve_policy("openai-chat:http://127.0.0.1:9/v1#tiny")   # constructing sends nothing
    assert served.config.api == "chat" and served.version.name == "tiny"
    (tmp_path / "notamodel").mkdir()
    with pytest.raises(PolicySpecError, match="no config.json"):
        resolve_policy(str(tmp_path / "notamodel"))
    with pytest.raises(PolicySpecError, match="needs --run-dir"):
        resolve_policy("round-1")
    with Store.for_run_dir(tmp_path) as store:
        store.put_policy_version("round-1", "base", "abc", path=str(tmp_path / "gone"))
    with pytest.raises(PolicySpecError, match="round-1: policy version found .* is not a directory"):
        resolve_policy("round-1", tmp_path)
    with pytest.raises(PolicySpecError, match=r"it has: round-1"):
        resolve_policy("round-2", tmp_path)


def test_eval_config_validation():
    with pytest.raises(ValueError, match="k must be positive"):
        EvalConfig(k=(0,))
    with pytest.raises(ValueError, match="ci\n  Input should be"):
        EvalConfig(ci="normal")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="--k must be"):
        EvalConfig.parse_k("1,x")
    assert EvalConfig(k=(8, 1, 8)).k == (1, 8) and EvalConfig(k=(1, 8)).n_samples == 8
    with pytest.raises(ValueError, match="unknown EvalConfig field"):
        EvalConfig.from_dict({"k": [1], "nope": 1})


def test_a_long_list_of_domains_is_not_a_file_name():
    """More than 255 bytes of comma-separated domains: the OS refuses the name (ENAMETOOLONG), so
    it must be read as domain globs, not fail as a file."""
    from posttrain.tasks.registry import match_domains

    names = [d.name for d in match_domains("math.*,text.*")][:40]
    spec = ",".join(names)
    assert len(spec) > 255
    tasks = resolve_tasks(spec, per_domain=1)
    assert {d.name for d, _ in tasks} == set(names)
