"""The main job: a short real run, resume after a kill, and config errors that name the field."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from posttrain.pipeline.config import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[1]
POSTTRAIN = [sys.executable, "-m", "posttrain.cli"]

SMOKE = """
name = "{name}"
runs_dir = "{runs}"
steps = {steps}
checkpoint_every = 2
[domains]
train = ["math.add.d2", "text.reverse.l3"]
heldout = ["math.add.d1"]
[rollout]
group_size = 4
groups_per_step = 4
[eval]
tasks_per_domain = 4
samples = 2
[trainer]
lr = 1e-4
"""


def _config(tmp_path, name="smoke", steps=4):
    path = tmp_path / f"{name}.toml"
    path.write_text(SMOKE.format(name=name, runs=tmp_path / "runs", steps=steps))
    return path


def _run(args, **kw):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run(POSTTRAIN + args, capture_output=True, text=True, env=env, cwd=ROOT, **kw)


@pytest.mark.slow
def test_smoke_run_writes_the_run_directory(tmp_path):
    cfg = _config(tmp_path)
    cfg.write_text(cfg.read_text().replace("checkpoint_every = 2", "checkpoint_every = 2\nkeep_checkpoints = 1"))
    p = _run(["run", str(cfg), "--json"], timeout=600)
    assert p.returncode == 0, p.stderr[-3000:] + p.stdout[-3000:]
    summary = json.loads(p.stdout.strip().splitlines()[-1])
    assert summary["steps"] == 4 and 0 <= summary["final_pass1"] <= 1
    run = tmp_path / "runs" / "smoke"
    for name in ("store.sqlite", "metrics.jsonl", "config.json", "evals/before.json", "evals/after.json",
                 "report.html", "summary.json", "checkpoints/latest.json", "contamination.json"):
        assert (run / name).exists(), name
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert sorted(p.name for p in (run / "checkpoints").glob("step-*")) == ["step-4"]  # step-2 pruned
    # every checkpoint_every (2) steps, the scheduler's per-domain figures against their quotas
    detail = {r["step"]: r["sched/domains"] for r in rows if "sched/domains" in r}
    assert sorted(detail) == [2, 4] and set(detail[4]) == {"math.add.d2", "text.reverse.l3"}
    assert sum(v["samples"] for v in detail[4].values()) >= 4 * 4 * 4
    assert all(0 <= v["quota"] <= 1 and "queue_wait_p99_s" in v for v in detail[4].values())
    assert all("family/math/reward" in r or "family/text/reward" in r for r in rows)
    from posttrain.storage.store import Store
    with Store.for_run_dir(run, readonly=True) as store:
        counts = store.counts("smoke")
        assert counts["episodes"] >= 4 * 4 * 4 and counts["infra_error"] == 0
        versions = {v["name"]: v for v in store.policy_versions()}
        assert versions["smoke/step-4"]["parent"] == "tiny-base" and "tiny-base" in versions
    # a second run in the same directory must not clobber it
    p = _run(["run", str(cfg)], timeout=120)
    assert p.returncode == 2 and "--resume" in p.stderr
    # round 2 starts from round 1's checkpoint and records its lineage
    cfg2 = _config(tmp_path, "round2", steps=2)
    p = _run(["run", str(cfg2), "--model", str(run / "checkpoints" / "step-4"), "--json"], timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    with Store.for_run_dir(tmp_path / "runs" / "round2", readonly=True) as store:
        versions = {v["name"]: v for v in store.policy_versions()}
        assert versions["round2/step-2"]["parent"] == "smoke/step-4"
    # and reports forgetting since the base model, across both rounds
    cumulative = json.loads(p.stdout.strip().splitlines()[-1])["cumulative_forgetting"]
    assert cumulative["rounds"] == ["smoke", "round2"] and cumulative["before"] == "smoke/before"
    assert (tmp_path / "runs" / "round2" / "forgetting" / "round2-from-base.json").is_file()


def _random_llama(path: Path, context: int) -> Path:
    """A randomly initialised tiny Llama with the shipped tokenizer and a longer context."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(ROOT / "models" / "tiny-base")
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=context,
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id)
    LlamaForCausalLM(config).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def _code_config(tmp_path, name: str, model: Path | None = None) -> Path:
    path = tmp_path / f"{name}.toml"
    text = (SMOKE.format(name=name, runs=tmp_path / "runs", steps=2)
            .replace('train = ["math.add.d2", "text.reverse.l3"]', 'train = ["code.list.chunk"]')
            .replace("groups_per_step = 4", "groups_per_step = 2"))
    if model is not None:
        text = text.replace("[domains]", f'[model]\npath = "{model}"\n[domains]')
    path.write_text(text)
    return path


@pytest.mark.slow
def test_prompts_longer_than_the_context_are_refused_before_the_run_starts(tmp_path):
    # the shipped model has 128 positions; a code task's prompt is ~450 characters
    p = _run(["run", str(_code_config(tmp_path, "toolong"))], timeout=300)
    assert p.returncode == 2, p.stderr[-3000:]
    assert "code.list.chunk (domains.train)" in p.stderr and "context of 128" in p.stderr
    assert not (tmp_path / "runs" / "toolong" / "store.sqlite").exists()
    # nothing was recorded: the same name can be started again once the config is fixed
    p = _run(["run", str(_config(tmp_path, "toolong", steps=1))], timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]


@pytest.mark.slow
def test_sandboxed_domains_run_in_the_job(tmp_path):
    # a domain whose verifier runs the model's code: the job opens a sandbox pool, and every
    # episode is verified there (a random model writes no working code: all fail, none is infra)
    model = _random_llama(tmp_path / "llama", context=1024)
    p = _run(["run", str(_code_config(tmp_path, "sandboxed", model)), "--json"], timeout=600)
    assert p.returncode == 0, p.stderr[-3000:] + p.stdout[-3000:]
    from posttrain.storage.store import Store
    with Store.for_run_dir(tmp_path / "runs" / "sandboxed", readonly=True) as store:
        code = list(store.trajectories(run_id="sandboxed", domain="code.list.chunk"))
        assert len(code) >= 2 * 4 * 2 and store.counts("sandboxed")["infra_error"] == 0
        assert all(t.status in ("completed", "truncated") and t.reward == 0.0 for t in code)
        verified = [t for t in code if t.verdict is not None]
        assert verified and all(t.timings.get("verify_s", 0) > 0 for t in verified)


@pytest.mark.slow
def test_killed_run_resumes_without_losing_or_duplicating_groups(tmp_path):
    cfg = _config(tmp_path, "killed", steps=6)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.Popen(POSTTRAIN + ["run", str(cfg)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env, cwd=ROOT)
    run = tmp_path / "runs" / "killed"
    deadline = time.time() + 300
    while time.time() < deadline and not (run / "checkpoints" / "step-2").exists():
        time.sleep(0.2)
    assert (run / "checkpoints" / "step-2").exists(), "no checkpoint appeared"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    p = _run(["run", str(cfg), "--resume", "--json"], timeout=600)
    assert p.returncode == 0, p.stderr[-3000:] + p.stdout[-2000:]
    assert json.loads(p.stdout.strip().splitlines()[-1])["steps"] == 6
    from posttrain.storage.store import Store
    with Store.for_run_dir(run, readonly=True) as store:
        trajs = list(store.trajectories(run_id="killed"))
    done = [t for t in trajs if t.status != "infra_error"]
    members = [(t.group_id, t.id) for t in done]
    assert len(members) == len(set(members))
    by_group = {}
    for t in done:
        by_group.setdefault(t.group_id, []).append(t)
    assert all(len(v) == 4 for v in by_group.values()), {k: len(v) for k, v in by_group.items()}
    steps = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps[-1] == 6 and sorted(set(steps)) == [1, 2, 3, 4, 5, 6]


@pytest.mark.parametrize("text,fragment", [
    ("steps = -1", "steps"),
    ("[rollout]\ngroup_size = 1", "rollout.group_size"),
    ("[rollout]\ngroup_sise = 4", "rollout.group_sise: unknown field"),
    ("name = ", "not valid TOML"),
])
def test_bad_configs_name_the_file_and_field(tmp_path, text, fragment):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert str(path) in str(e.value) and fragment in str(e.value)


@pytest.mark.slow
def test_bad_trainer_field_and_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="no such config file"):
        load_config(tmp_path / "nope.toml")
    path = tmp_path / "t.toml"
    path.write_text(f'name = "t"\nruns_dir = "{tmp_path}"\n[trainer]\nlrr = 1\n[domains]\ntrain = ["math.add.d1"]\n')
    p = _run(["run", str(path)], timeout=300)
    assert p.returncode == 2 and "lrr" in p.stderr and "trainer" in p.stderr


@pytest.mark.slow
def test_training_stops_cleanly_when_every_domain_is_retired(tmp_path, monkeypatch):
    """When the scheduler can deliver nothing more (all domains saturated and retired, or
    quarantined), the job checkpoints what it learned, evaluates and reports the early stop."""
    from posttrain.scheduling import Scheduler, SchedulerStalled

    real_take = Scheduler.take
    calls = {"n": 0}

    async def take(self, n):
        calls["n"] += 1
        if calls["n"] > 2:
            raise SchedulerStalled("every trainer-tier domain is retired: math.add.d2 (saturated)")
        return await real_take(self, n)

    monkeypatch.setattr(Scheduler, "take", take)
    from typer.testing import CliRunner

    from posttrain.cli import app

    done = CliRunner().invoke(app, ["run", str(_config(tmp_path, "stall", steps=5))])
    run = tmp_path / "runs" / "stall"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stopped_early"] and "retired" in summary["stopped_early"]
    assert json.loads((run / "checkpoints" / "latest.json").read_text())["step"] == 2
    assert (run / "evals" / "after.json").exists()
    # not what was asked: exit 3, and the summary says why in one line
    why = "training stopped at step 2 of 5: every trainer-tier domain is retired: math.add.d2 (saturated)"
    assert done.exit_code == 3 and summary["untrustworthy"] == [why], done.output
    assert summary["steps_done"] == 2 and why in done.output


@pytest.mark.slow
def test_ctrl_c_says_how_to_resume_and_old_checkpoints_are_pruned(tmp_path):
    cfg = tmp_path / "ctrlc.toml"
    cfg.write_text(SMOKE.format(name="ctrlc", runs=tmp_path / "runs", steps=500)
                   .replace("checkpoint_every = 2", "checkpoint_every = 1\nkeep_checkpoints = 2"))
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.Popen(POSTTRAIN + ["run", str(cfg)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, cwd=ROOT,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    ckpts = tmp_path / "runs" / "ctrlc" / "checkpoints"
    deadline = time.time() + 300
    while time.time() < deadline and not (ckpts / "step-4").exists():
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    step = json.loads((ckpts / "latest.json").read_text())["step"]
    assert f"the last checkpoint is step {step}" in err and f"run {cfg} --resume" in err
    kept = sorted(int(p.name[5:]) for p in ckpts.glob("step-*"))
    # (a Ctrl-C between writing a checkpoint and pruning the oldest may leave one more)
    assert kept[-1] == step and len(kept) <= 3 and step >= 4
