"""A careless user's mistakes: each is one clear line naming the file, field or path, a non-zero
exit, no traceback and nothing left behind; a run directory has one owner; a result that is
mostly infrastructure errors does not exit 0."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from posttrain import runlock
from posttrain.cli import main
from posttrain.errors import EXIT_BAD_INPUT, EXIT_UNTRUSTWORTHY, UserError, describe, is_disk_full, no_space
from posttrain.tasks import registry

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT / "src")}


@pytest.fixture(autouse=True)
def _release_locks():
    yield
    for key in list(runlock._held):
        runlock.release(key)


def cli(capsys, monkeypatch, *args: str) -> tuple[int, str]:
    """Run `posttrain ARGS` in this process as the console script does: (exit code, stdout+stderr)."""
    monkeypatch.setattr(sys, "argv", ["posttrain", *args])
    try:
        main()
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    out = capsys.readouterr()
    text = out.out + out.err
    assert "Traceback" not in text, text
    return code, text


def posttrain(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "posttrain.cli", *args], env=ENV, capture_output=True,
                          text=True, timeout=timeout)


def _config(tmp_path: Path, body: str, name: str = "bad") -> Path:
    path = tmp_path / f"{name}.toml"
    steps = "" if body.startswith("steps") else "steps = 1\n"
    path.write_text(f'name = "{name}"\nruns_dir = "{tmp_path / "runs"}"\n{steps}' + body)
    return path


# -- posttrain run: bad configs are refused before anything is written ----------------------------

def test_a_model_path_that_does_not_exist(tmp_path, capsys, monkeypatch):
    cfg = _config(tmp_path, '[model]\npath = "/no/such/model"\n')
    code, out = cli(capsys, monkeypatch, "run", str(cfg))
    assert code == EXIT_BAD_INPUT
    assert f"{cfg}: model.path: no such model directory: /no/such/model" in out
    assert not (tmp_path / "runs").exists()  # no config.json (or anything) left behind


def test_a_model_override_that_is_not_a_model(tmp_path, capsys, monkeypatch):
    code, out = cli(capsys, monkeypatch, "run", "--model", str(tmp_path), "--name", "x")
    assert code == EXIT_BAD_INPUT and "--model: not a Hugging Face model directory" in out
    assert str(tmp_path) in out


def test_cuda_on_a_cpu_build(tmp_path, capsys, monkeypatch):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    cfg = _config(tmp_path, '[model]\ndevice = "cuda"\n')
    code, out = cli(capsys, monkeypatch, "run", str(cfg))
    assert code == EXIT_BAD_INPUT and f"{cfg}: model.device: 'cuda' asked for" in out
    assert len(out.strip().splitlines()) == 1 and not (tmp_path / "runs").exists()


@pytest.mark.parametrize("body, field, words", [
    ('[trainer]\nlr = "fast"\n', "trainer.lr", "'fast'"),
    ("[trainer]\nlr = -1.0\n", "trainer.lr", "must be > 0 (got -1.0)"),
    ("[scheduler]\nshare_by = \"time\"\n", "scheduler.share_by", "Input should be"),
    ("[scheduler.retry]\nmax_retries = -1\n", "scheduler.retry.max_retries", "must be >= 0"),
    ('[scheduler.domains."math.*"]\ntier = "gold"\n', "scheduler.domains.math.*.tier", "must be one of tiers"),
    ("[eval]\nsamples = 4\nk = [1, 2]\n", "eval", "not both"),
    ("[trainer]\nlearning_rate = 1e-4\n", "trainer.learning_rate", "unknown field"),
    ("steps = -3\n", "steps", "greater than or equal to 0"),
    ("[rollout]\ngroup_size = 1\n", "rollout.group_size", "greater than or equal to 2"),
    ("[rollot]\ngroup_size = 4\n", "rollot", "unknown field"),
])
def test_bad_config_values_name_the_file_and_the_field(tmp_path, capsys, monkeypatch, body, field, words):
    cfg = _config(tmp_path, body)
    code, out = cli(capsys, monkeypatch, "run", str(cfg))
    assert code == EXIT_BAD_INPUT, out
    assert f"{cfg}: {field}" in out and words in out, out
    assert not (tmp_path / "runs").exists()


def test_bad_set_overrides_name_the_override(tmp_path, capsys, monkeypatch):
    cfg = _config(tmp_path, "")
    for args, words in ((["--set", "trainer.lr=-1"], f"{cfg}: trainer.lr: must be > 0"),
                        (["--set", "trainer.lr"], "--set 'trainer.lr': expected KEY=VALUE"),
                        (["--set", "steps.x=1"], f"{cfg}: steps: is a value, not a section"),
                        (["--set", "trainer.learning_rate=1"], f"{cfg}: trainer.learning_rate: unknown field")):
        code, out = cli(capsys, monkeypatch, "run", str(cfg), *args)
        assert code == EXIT_BAD_INPUT and words in out, out
    assert not (tmp_path / "runs").exists()
    # the value reaches the job; a flag wins over --set (steps = -1 would be refused first)
    code, out = cli(capsys, monkeypatch, "run", str(cfg), "--set", 'domains.train=["nosuch.*"]',
                    "--set", "steps=-1", "--steps", "2")
    assert code == EXIT_BAD_INPUT and "no domain matches 'nosuch.*'" in out, out
    assert not (tmp_path / "runs").exists()  # found after the run folder was made: removed, runs/ too


def test_a_resume_under_other_settings_is_refused_and_changes_nothing(tmp_path, capsys, monkeypatch):
    """`--resume` continues exactly the run that was interrupted: a changed setting (which the
    checkpoint's trainer would not even read) is refused, naming it, before anything is written;
    only what does not change what the steps do may differ (`RESUMABLE_CHANGES`)."""
    from posttrain.pipeline.config import check_resume, load_config, resume_changes

    cfg = _config(tmp_path, "[trainer]\nlr = 1e-4\n[domains.weights]\n\"math.*\" = 2.0\n")
    run_dir = load_config(cfg).run_dir
    run_dir.mkdir(parents=True)
    recorded = load_config(cfg).model_dump(mode="json")
    (run_dir / "config.json").write_text(json.dumps(recorded))
    (run_dir / "store.sqlite").write_bytes(b"")  # a started run (nothing else is read here)
    before = (run_dir / "config.json").read_bytes()
    for args, words in ((["--set", "trainer.lr=1e-5"], "trainer.lr: 0.0001 -> 1e-05"),
                        (["--set", "rollout.group_size=4"], "rollout.group_size: 8 -> 4"),
                        (["--set", 'domains.weights."text.*"=3.0'], "domains.weights.text.*: '(absent)' -> 3.0"),
                        (["--set", "domains.weights={}"], "domains.weights.math.*: 2.0 -> '(absent)'")):
        code, out = cli(capsys, monkeypatch, "run", str(cfg), "--resume", *args)
        assert code == EXIT_BAD_INPUT and words in out and "a resume must repeat them" in out, out
        named = [line for line in out.splitlines()[1:] if " -> " in line]
        # the change, and what the config derives from it (the scheduler's group shape)
        assert len(named) == (4 if "group_size" in args[1] else 1), out
    assert (run_dir / "config.json").read_bytes() == before and not (run_dir / "status.json").exists()
    # what may change on a resume; the same config resumes (the check passes)
    same = load_config(cfg, {"steps": 9, "checkpoint_every": 3, "model.threads": 1,
                             "eval.baseline": "x.json", "eval.base_from": "runs/other",
                             "logging.backends": []})
    assert resume_changes(recorded, same) == []
    check_resume(same)
    # a field this version added since the run started compares as its default
    older = {k: v for k, v in recorded.items() if k != "allow_contamination"}
    assert resume_changes(older, load_config(cfg)) == []
    assert resume_changes(older, load_config(cfg, {"allow_contamination": True})) == [
        "allow_contamination: False -> True"]
    (run_dir / "config.json").write_text("{not json")
    with pytest.raises(Exception, match="recorded config is unreadable"):
        check_resume(same)


def test_a_missing_or_malformed_config_file(tmp_path, capsys, monkeypatch):
    code, out = cli(capsys, monkeypatch, "run", str(tmp_path / "nope.toml"))
    assert code == EXIT_BAD_INPUT and f"{tmp_path / 'nope.toml'}: no such config file" in out
    bad = tmp_path / "broken.toml"
    bad.write_text("steps = = 3\n")
    code, out = cli(capsys, monkeypatch, "run", str(bad))
    assert code == EXIT_BAD_INPUT and f"{bad}: not valid TOML" in out and "line 1" in out
    code, out = cli(capsys, monkeypatch, "run", "--steps", "-1")
    assert code == EXIT_BAD_INPUT and "--steps" in out


def test_an_unknown_domain_glob(tmp_path, capsys, monkeypatch):
    cfg = _config(tmp_path, '[domains]\ntrain = ["nosuch.*"]\nheldout = []\n')
    code, out = cli(capsys, monkeypatch, "run", str(cfg))
    assert code == EXIT_BAD_INPUT and "no domain matches 'nosuch.*'" in out
    code, out = cli(capsys, monkeypatch, "eval", "--policy", "oracle", "--tasks", "nosuch.*")
    assert code == EXIT_BAD_INPUT and "--tasks: no domain matches 'nosuch.*'" in out


def test_a_run_that_needs_a_sandbox_where_none_can_start(tmp_path, capsys, monkeypatch):
    """No bubblewrap: one line naming what to install, exit 1, said before the run's checks and
    evaluations (minutes, with hundreds of domains), not as a traceback at the first episode."""
    from posttrain.sandbox import bwrap

    monkeypatch.setattr(bwrap, "find_bwrap", lambda: None)
    monkeypatch.delenv("POSTTRAIN_ALLOW_UNSANDBOXED", raising=False)
    bwrap.bwrap_problem.cache_clear()
    try:
        cfg = _config(tmp_path, '[domains]\ntrain = ["code.dict.merge"]\nheldout = []\n', name="nobwrap")
        ran = cli(capsys, monkeypatch, "run", str(cfg))
        evaluated = cli(capsys, monkeypatch, "eval", "--policy", "oracle", "--tasks", "code.dict.merge",
                        "--per-domain", "1")
    finally:
        bwrap.bwrap_problem.cache_clear()
    missing = ("error: bubblewrap (bwrap) is not installed: install it with `apt-get install bubblewrap` "
               "(Debian/Ubuntu; `dnf install bubblewrap` on Fedora)")
    for code, out in (ran, evaluated):
        assert code == 1, out
        assert [line for line in out.splitlines() if line.startswith("error:")] == [missing], out
    assert not list((tmp_path / "runs").rglob("*.json"))  # said before the checks: no config.json


# -- a full disk ---------------------------------------------------------------------------------

def test_a_full_disk_during_a_checkpoint_names_the_checkpoint(tmp_path, monkeypatch):
    from posttrain.training import checkpoints

    def write(tmp):
        (tmp / "model.safetensors").write_bytes(b"x")
        raise OSError(errno.ENOSPC, "No space left on device")

    target = tmp_path / "checkpoints" / "step-5"
    with pytest.raises(OSError) as info:
        checkpoints.write_atomic(target, write)
    assert describe(info.value) == (1, f"no space left on device (writing a checkpoint): {target}")
    assert list((tmp_path / "checkpoints").iterdir()) == []  # no .step-5.tmp-* left behind
    # torch's own words for it name neither the cause nor the file: the file system is asked
    torch_words = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(1 << 20, 1 << 20, 0))
    assert is_disk_full(torch_words, tmp_path)
    monkeypatch.undo()
    assert not is_disk_full(torch_words, tmp_path)


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("mount"), reason="mounting a tmpfs needs root")
def test_a_full_tmpfs_during_a_real_checkpoint(tmp_path, capsys):
    from posttrain.training.trainer import Trainer

    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(disk)]).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        trainer = Trainer(ROOT / "models" / "tiny-base")
        with pytest.raises(OSError) as info:
            trainer.save(disk / "checkpoints" / "step-1")
        code, line = describe(info.value)
        assert code == 1 and line == f"no space left on device (writing a checkpoint): {disk}/checkpoints/step-1"
        assert list((disk / "checkpoints").iterdir()) == []
    finally:
        subprocess.run(["umount", str(disk)])


def test_the_cli_boundary_prints_one_line(capsys, monkeypatch):
    from posttrain.errors import run_cli

    def full():
        raise no_space("/data/runs/x/metrics.jsonl")

    with pytest.raises(SystemExit) as info:
        run_cli(full)
    assert info.value.code == 1
    assert capsys.readouterr().err == "error: no space left on device: /data/runs/x/metrics.jsonl\n"
    with pytest.raises(SystemExit) as info:
        run_cli(lambda: (_ for _ in ()).throw(UserError("must be > 0", file="a.toml", field="x.y")))
    assert info.value.code == EXIT_BAD_INPUT and capsys.readouterr().err == "error: a.toml: x.y: must be > 0\n"
    with pytest.raises(ZeroDivisionError):  # a bug keeps its traceback
        run_cli(lambda: 1 / 0)
    monkeypatch.setenv("POSTTRAIN_DEBUG", "1")
    with pytest.raises(OSError):
        run_cli(full)


# -- export, replay, rollout ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("run") / "r"
    done = posttrain("rollout", "--policy", "oracle", "--domains", "math.add.d1", "--n", "2", "--run-dir", str(run))
    assert done.returncode == 0, done.stderr
    return run


@pytest.mark.slow
def test_export_to_an_odd_or_unwritable_path(small_run, tmp_path, capsys, monkeypatch):
    code, out = cli(capsys, monkeypatch, "export", str(small_run), "--out", str(tmp_path))
    assert code == EXIT_BAD_INPUT and f"--out '{tmp_path}': is a directory" in out
    code, out = cli(capsys, monkeypatch, "export", str(small_run), "--out", str(tmp_path / "no" / "x.parquet"))
    assert code == EXIT_BAD_INPUT and f"the directory {tmp_path / 'no'} does not exist" in out
    code, out = cli(capsys, monkeypatch, "export", str(small_run), "--out", "/proc/x.parquet")
    assert code == EXIT_BAD_INPUT and "--out /proc/x.parquet: cannot write: No such file or directory" in out
    code, out = cli(capsys, monkeypatch, "export", str(tmp_path / "typo"), "--out", str(tmp_path / "a.jsonl"),
                    "--format", "jsonl")
    assert code == EXIT_BAD_INPUT and "not a run directory" in out and list(tmp_path.iterdir()) == []
    code, out = cli(capsys, monkeypatch, "export", str(small_run), "--out", str(tmp_path / "a.jsonl"),
                    "--format", "jsonl")
    assert code == 0 and len((tmp_path / "a.jsonl").read_text().splitlines()) == 2
    code, out = cli(capsys, monkeypatch, "export", str(small_run), "--out", str(tmp_path / "b.jsonl"),
                    "--format", "jsonl", "--run-id", "rollout-typo")
    assert code == EXIT_BAD_INPUT and "--run-id 'rollout-typo': no such run in" in out
    assert [p.name for p in tmp_path.iterdir()] == ["a.jsonl"]  # no temp file left


@pytest.mark.slow
def test_replay_creates_nothing(small_run, tmp_path, capsys, monkeypatch):
    store = small_run / "store.sqlite"
    code, out = cli(capsys, monkeypatch, "replay", str(store), "--all")
    assert code == EXIT_BAD_INPUT and f"{store}: is a file; give the run directory" in out
    assert not (Path(f"{store}") / "store.sqlite").exists()
    typo = tmp_path / "runz" / "r"
    code, out = cli(capsys, monkeypatch, "replay", str(typo), "--all")
    assert code == EXIT_BAD_INPUT and f"{typo}: not a run directory" in out
    assert list(tmp_path.iterdir()) == []
    code, out = cli(capsys, monkeypatch, "replay", str(small_run), "nosuchid")
    assert code == EXIT_BAD_INPUT and "no trajectory matches id 'nosuchid'" in out
    code, out = cli(capsys, monkeypatch, "replay", str(small_run), "--all")
    assert code == 0 and "replayed 2, matched 2" in out


@pytest.fixture
def eval_only_harbor(tmp_path, monkeypatch):
    """A Harbor example pinned to the eval split (an imported task lives in one split; which
    one an unpinned folder lands in depends on its content)."""
    import posttrain.tasks.families.terminal as terminal

    folder = tmp_path / "harbor" / "count-errors"
    shutil.copytree(ROOT / "examples" / "harbor" / "count-errors", folder)
    toml = folder / "task.toml"
    toml.write_text(toml.read_text().replace("[metadata]\n", '[metadata]\nsplit = "eval"\n'))
    monkeypatch.setattr(terminal, "EXAMPLES_DIR", folder.parent)
    registry.reset_cache()
    yield "terminal.harbor.count-errors"
    registry.reset_cache()


def test_rollout_skips_domains_without_tasks_in_the_split(eval_only_harbor, tmp_path, capsys, monkeypatch):
    # the README's `--domains 'terminal.*'` met a Harbor example that is an eval-split task
    code, out = cli(capsys, monkeypatch, "rollout", "--domains", f"{eval_only_harbor},math.add.d1",
                    "--n", "1", "--run-dir", str(tmp_path / "r"))
    assert code == 0, out
    assert f"skipped 1 domain(s) with no train-split tasks: {eval_only_harbor}" in out
    assert "episodes 1, completed 1" in out
    code, out = cli(capsys, monkeypatch, "rollout", "--domains", "math.add.d1", "--run-dir",
                    str(tmp_path / "r" / "store.sqlite"))
    assert code == EXIT_BAD_INPUT and "store.sqlite is a file (or under one), not a directory" in out
    code, out = cli(capsys, monkeypatch, "rollout", "--domains", eval_only_harbor,
                    "--run-dir", str(tmp_path / "r2"))
    assert code == EXIT_BAD_INPUT and "no matching domain has train-split tasks (try --split eval)" in out
    assert not (tmp_path / "r2").exists()


# -- task files and broken task folders ----------------------------------------------------------

def test_eval_reads_the_toml_task_files_the_readme_documents(tmp_path, capsys, monkeypatch):
    good = tmp_path / "tasks.toml"
    good.write_text('domain = "math.add.d1"\n[[tasks]]\nprompt = "2+3="\nreference = {answer = "5"}\n'
                    '[[tasks]]\nprompt = "4+4="\nreference = {answer = "8"}\n')
    code, out = cli(capsys, monkeypatch, "eval", "--policy", "oracle", "--tasks", str(good), "--json")
    assert code == 0, out
    brief = json.loads(out.splitlines()[-1])
    assert brief["tasks"] == 2 and brief["macro_pass1"] == 1.0
    bad = tmp_path / "bad.toml"
    bad.write_text('domain = "math.add.d1"\n[[tasks]]\nprompt = 5\n')
    code, out = cli(capsys, monkeypatch, "eval", "--policy", "oracle", "--tasks", str(bad))
    assert code == EXIT_BAD_INPUT and f"--tasks: {bad}:2 (tasks[0]): field 'prompt'" in out


@pytest.fixture
def broken_harbor(tmp_path, monkeypatch):
    import posttrain.tasks.families.terminal as terminal

    folder = tmp_path / "harbor"
    shutil.copytree(ROOT / "examples" / "harbor", folder)
    (folder / "count-errors" / "task.toml").write_text("[agent\ntimeout_sec = 5\n")
    monkeypatch.setattr(terminal, "EXAMPLES_DIR", folder)
    registry.reset_cache()
    yield folder
    registry.reset_cache()


def test_a_broken_harbor_folder_is_reported_and_skipped(broken_harbor, capsys, monkeypatch, caplog):
    where = f"{broken_harbor}/count-errors/task.toml: invalid TOML"
    code, out = cli(capsys, monkeypatch, "eval", "--policy", "oracle", "--tasks", "math.add.d1",
                    "--per-domain", "2", "--json")
    assert code == 0, out
    # a warning on stderr (pytest captures log records before they reach stderr)
    assert f"skipped terminal.harbor.count-errors: {where}" in caplog.text
    assert json.loads(out.splitlines()[-1])["macro_pass1"] == 1.0
    assert "terminal.harbor.median-bugfix" in registry.all_domains()  # its neighbours still load
    code, out = cli(capsys, monkeypatch, "rollout", "--domains", "terminal.harbor.count-errors",
                    "--run-dir", str(broken_harbor.parent / "r"))
    assert code == EXIT_BAD_INPUT and f"domain 'terminal.harbor.count-errors' cannot be loaded: {where}" in out
    assert not (broken_harbor.parent / "r").exists()


# -- one owner per run directory (two real processes) ---------------------------------------------

def _hold_lock(run_dir: Path) -> subprocess.Popen:
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from posttrain import runlock; "
                               "runlock.acquire(sys.argv[1], 'test'); print('held', flush=True); time.sleep(60)",
                               str(run_dir)], env=ENV, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    return holder


@pytest.mark.slow
def test_a_second_writer_is_refused_until_the_owner_dies(tmp_path):
    run_dir = tmp_path / "runs" / "shared"
    holder = _hold_lock(run_dir)
    try:
        for args in (["eval", "--policy", "oracle", "--tasks", "math.add.d1", "--per-domain", "1",
                      "--run-dir", str(run_dir)],
                     ["rollout", "--domains", "math.add.d1", "--n", "1", "--run-dir", str(run_dir)],
                     ["run", "--name", "shared", "--steps", "1"]):
            if args[0] == "run":
                cfg = tmp_path / "c.toml"
                cfg.write_text(f'runs_dir = "{tmp_path / "runs"}"\n')
                args = ["run", str(cfg), *args[1:]]
            done = posttrain(*args)
            assert done.returncode == EXIT_BAD_INPUT, (args, done.stdout, done.stderr)
            assert (f"error: run directory {run_dir} is in use by another posttrain process "
                    f"(pid {holder.pid}") in done.stderr, done.stderr
            assert "Traceback" not in done.stderr
        assert sorted(p.name for p in run_dir.iterdir()) == [".lock"]  # nobody wrote a thing
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    # the kernel released the dead owner's lock: no stale lock to clean up
    done = posttrain("rollout", "--domains", "math.add.d1", "--n", "1", "--run-dir", str(run_dir))
    assert done.returncode == 0, done.stderr


def test_an_eval_name_is_never_reused(tmp_path, capsys, monkeypatch):
    from posttrain.storage.store import Store

    run_dir = tmp_path / "r"
    args = ["eval", "--policy", "oracle", "--tasks", "math.add.d1", "--per-domain", "2", "--run-dir", str(run_dir)]
    code, out = cli(capsys, monkeypatch, *args, "--name", "base")
    assert code == 0, out
    saved = (run_dir / "evals" / "base.json").read_text()
    code, out = cli(capsys, monkeypatch, *args, "--name", "base", "--policy", "wrong")
    assert code == EXIT_BAD_INPUT and "--name: an eval named 'base' already exists" in out
    assert (run_dir / "evals" / "base.json").read_text() == saved
    with Store.for_run_dir(run_dir, readonly=True) as store:
        assert store.counts("eval:base")["episodes"] == 2  # no rows merged in
    # default names never collide either: two in the same second get different files
    for _ in range(2):
        assert cli(capsys, monkeypatch, *args)[0] == 0
    assert len(list((run_dir / "evals").glob("scripted-oracle-*.json"))) == 2


# -- honest exit codes -----------------------------------------------------------------------------

@pytest.mark.slow
def test_eval_against_a_closed_port_exits_non_zero(tmp_path):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    done = posttrain("eval", "--policy", f"openai:http://127.0.0.1:{port}/v1#m", "--tasks", "math.add.d1",
                     "--per-domain", "2", "--run-dir", str(tmp_path / "r"), "--name", "down")
    assert done.returncode == EXIT_UNTRUSTWORTHY, done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    assert "not trustworthy:" in done.stderr
    assert "1 domain(s) had infrastructure errors on every episode (no score): math.add.d1" in done.stderr
    assert (tmp_path / "r" / "evals" / "down.json").is_file()  # the record of what failed is kept


def test_the_threshold_decides(tmp_path):
    from posttrain.evaluation.trust import untrustworthy

    summary = {"episodes": 100, "infra_error_rate": 0.04,
               "domains": {"a": {"infra_error_rate": 0.0}, "b": {"infra_error_rate": 0.08}}}
    assert untrustworthy(summary) == []
    assert untrustworthy(summary, max_infra_rate=0.03) == [
        "4.0% of 100 episodes were infrastructure errors (threshold 3%, --max-infra-rate)"]
    summary["domains"]["b"]["infra_error_rate"] = 1.0
    assert untrustworthy(summary, max_infra_rate=1.0) == [
        "1 domain(s) had infrastructure errors on every episode (no score): b"]


def test_a_run_whose_evaluation_failed_entirely_exits_non_zero(tmp_path, capsys, monkeypatch):
    """The job's evaluation goes through the same rule: a run whose `after` evaluation is all
    infrastructure errors (a policy server that died) does not exit 0."""
    from posttrain.evaluation.runner import run_eval
    from posttrain.evaluation.tasksets import tasks_from_domains
    from posttrain.pipeline.main import Job
    from posttrain.policies.base import PolicyError
    from posttrain.policies.scripted import ScriptedPolicy

    class Dead(ScriptedPolicy):
        def generate(self, requests):
            raise PolicyError("server at 127.0.0.1:1 went away")

    def fake_run(self):  # Job.run's evaluations and its verdict on them, without the training
        from posttrain.pipeline.report import untrustworthy_reasons

        tasks = tasks_from_domains("math.add.d1", 2)
        before = run_eval(ScriptedPolicy.named("oracle"), tasks, name="before")
        after = run_eval(Dead.named("oracle"), tasks, name="after")
        return {"run": self.config.name, "untrustworthy": untrustworthy_reasons(
            before, after, self.max_infra_rate, steps=1, steps_done=1, stopped_early=None)}

    monkeypatch.setattr(Job, "run", fake_run)
    cfg = _config(tmp_path, "", name="dies")
    code, out = cli(capsys, monkeypatch, "run", str(cfg))
    assert code == EXIT_UNTRUSTWORTHY, out
    assert "evals/after: 1 domain(s) had infrastructure errors on every episode" in out
    assert "evals/before" not in out


def test_a_run_whose_training_diverged_exits_untrustworthy_in_one_line(tmp_path, capsys, monkeypatch):
    """Gradients that stay inf or nan stop the trainer (`NonFiniteUpdates`): `posttrain run`
    says so in one line, marks the run failed and exits 3, not 0 and not with a traceback."""
    from posttrain import runs
    from posttrain.pipeline.main import Job
    from posttrain.training.trainer import NonFiniteUpdates

    def diverges(self):
        raise NonFiniteUpdates("step 3: the gradient was inf or nan in every update of the last 3 steps")

    monkeypatch.setattr(Job, "run", diverges)
    cfg = _config(tmp_path, "", name="diverges")
    code, out = cli(capsys, monkeypatch, "run", str(cfg))
    assert code == EXIT_UNTRUSTWORTHY, out
    assert out.strip() == ("error: the training diverged: step 3: the gradient was inf or nan in every "
                           "update of the last 3 steps")
    status = json.loads((tmp_path / "runs" / "diverges" / runs.STATUS_FILE).read_text())
    assert status["status"] == "failed" and "inf or nan" in status["error"]
