"""Exports other trainers read (verl, TRL, SFT): they load with `datasets`, every row maps back to
its trajectory, and the counts match the store."""

import contextlib
import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from posttrain.storage.store import Store

ROOT = Path(__file__).resolve().parents[1]

# `datasets` is imported by the tests that load an export, not when the module is collected
pytestmark = pytest.mark.skipif(importlib.util.find_spec("datasets") is None, reason="needs datasets")


def _cli(args, cwd):
    """The CLI in this process (what is tested is the files it writes, not the process): its exit
    code as `returncode`, its stderr; an exception it raised is re-raised."""
    from typer.testing import CliRunner

    from posttrain import runlock
    from posttrain.cli import app
    from posttrain.tasks import registry
    from posttrain.tasks.sources import _loaded

    with contextlib.chdir(cwd):
        r = CliRunner().invoke(app, [str(a) for a in args])
    if "--run-dir" in args:  # a writer holds its run directory's lock for the process's life
        runlock.release(Path(cwd) / args[args.index("--run-dir") + 1])
    if "--source" in args:  # its domains were registered for the process: forget them again
        registry.reset_cache()
        _loaded.clear()
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        raise r.exception
    return SimpleNamespace(returncode=r.exit_code, stderr=r.stderr, stdout=r.stdout)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A store with single-turn data episodes (passed and failed) and multi-turn tool episodes."""
    tmp = tmp_path_factory.mktemp("export")
    with open(tmp / "qa.jsonl", "w") as f:
        for i in range(40):
            f.write(json.dumps({"question": f"{i}+{i}=", "answer": str(2 * i)}) + "\n")
    for policy, domains, n in (("oracle", "data.qa", 6), ("wrong", "data.qa", 4),
                               ("oracle", "code.repair.list.kth", 1)):
        p = _cli(["rollout", "--source", "data:qa.jsonl", "--policy", policy, "--domains", domains,
                  "--n", str(n), "--run-dir", "run", "--workers", "1"], tmp)
        assert p.returncode == 0, p.stderr[-2000:]
    return tmp / "run"


def _load(path: Path):
    import datasets

    kind = "json" if path.suffix == ".jsonl" else "parquet"
    return datasets.load_dataset(kind, data_files=str(path), split="train")


def _store_view(run_dir):
    with Store.for_run_dir(run_dir, readonly=True) as store:
        return {t.id: t for t in store.trajectories()}, store.counts()


@pytest.mark.slow
def test_verl_prompt_schema(run_dir, tmp_path):
    out = tmp_path / "verl.parquet"
    p = _cli(["export", str(run_dir), "--format", "verl", "--out", str(out)], tmp_path)
    assert p.returncode == 0, p.stderr
    ds = _load(out)
    trajs, counts = _store_view(run_dir)
    assert len(ds) == counts["episodes"] == len(trajs)
    assert set(ds.column_names) == {"data_source", "prompt", "ability", "reward_model", "extra_info"}
    for row in ds:
        t = trajs[row["extra_info"]["trajectory_id"]]
        assert row["data_source"] == t.domain and row["ability"] == t.domain.split(".")[0]
        assert row["prompt"] == [{"role": "user", "content": t.turns[0].observation}]
        assert row["reward_model"]["style"] == "rule" and row["extra_info"]["reward"] == t.reward
        if t.domain == "data.qa":  # the reference answer: what verl's rule rewards compare with
            assert row["reward_model"]["ground_truth"] == str(2 * int(t.turns[0].observation.split("+")[0]))
    assert len({r["extra_info"]["trajectory_id"] for r in ds}) == len(ds)


def test_trl_is_conversational_when_an_episode_has_several_turns(run_dir, tmp_path):
    trajs, counts = _store_view(run_dir)
    assert any(len(t.turns) > 1 for t in trajs.values())
    out = tmp_path / "trl.jsonl"
    assert _cli(["export", str(run_dir), "--format", "trl", "--out", str(out)], tmp_path).returncode == 0
    ds = _load(out)
    assert len(ds) == counts["completed"] + counts["truncated"]
    for row in ds:
        t = trajs[row["trajectory_id"]]
        assert row["reward"] == t.reward and row["prompt"][0]["content"] == t.turns[0].observation
        assert [m["content"] for m in row["completion"] if m["role"] == "assistant"] == [u.action for u in t.turns]


@pytest.mark.slow
def test_trl_standard_and_sft_passed_only(run_dir, tmp_path):
    trajs, _ = _store_view(run_dir)
    out = tmp_path / "trl.parquet"
    p = _cli(["export", str(run_dir), "--format", "trl", "--run-id", _run_of(trajs, "data.qa", "wrong"),
              "--out", str(out)], tmp_path)
    assert p.returncode == 0, p.stderr
    ds = _load(out)
    assert isinstance(ds[0]["prompt"], str) and ds[0]["reward"] == 0.0  # one-turn episodes: plain text
    out = tmp_path / "sft.parquet"
    p = _cli(["export", str(run_dir), "--format", "sft", "--passed-only", "--out", str(out)], tmp_path)
    assert p.returncode == 0, p.stderr
    ds = _load(out)
    passed = [t for t in trajs.values() if t.passed]
    assert len(ds) == len(passed) == 7 and all(r["passed"] for r in ds)
    for row in ds:
        t = trajs[row["trajectory_id"]]
        assert row["messages"][0] == {"role": "user", "content": t.turns[0].observation}
        assert row["messages"][-1] == {"role": "assistant", "content": t.turns[-1].action}
    p = _cli(["export", str(run_dir), "--format", "verl", "--passed-only", "--out", str(out)], tmp_path)
    assert p.returncode == 2 and "--passed-only" in p.stderr


def _run_of(trajs, domain, policy):
    runs = {}
    for t in trajs.values():
        if t.domain == domain:
            runs.setdefault(t.run_id, []).append(t.passed)
    return next(r for r, passed in runs.items() if not any(passed))


@pytest.mark.slow
def test_trl_export_trains_a_trl_model_for_a_step(run_dir, tmp_path):
    pytest.importorskip("trl", reason="TRL is in the `bench` extra (pip install -e .[bench])")
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    trajs, _ = _store_view(run_dir)
    out = tmp_path / "trl.parquet"
    p = _cli(["export", str(run_dir), "--format", "trl", "--passed-only", "--run-id",
              next(t.run_id for t in trajs.values() if t.domain == "data.qa" and t.passed), "--out", str(out)],
             tmp_path)
    assert p.returncode == 0, p.stderr
    ds = _load(out).select_columns(["prompt", "completion"])
    model_dir = ROOT / "models" / "tiny-base"
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    args = SFTConfig(output_dir=str(tmp_path / "sft"), max_steps=1, per_device_train_batch_size=2,
                     learning_rate=1e-3, report_to=[], use_cpu=True, save_strategy="no", logging_steps=1)
    trainer = SFTTrainer(model=model, args=args, train_dataset=ds, processing_class=tokenizer)
    result = trainer.train()
    assert result.global_step == 1
    assert any(not (p.detach() == before[n]).all() for n, p in model.named_parameters())
