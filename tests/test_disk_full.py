"""A full disk outside checkpoints: every write site says "no space left on device" and names its
file (exit 1 at the command line), and what was recorded before stays intact.

The sites are tried on a real, tiny tmpfs that is filled up (needs root; skipped otherwise); the
naming rule itself is also checked by injection, which runs anywhere."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from posttrain.errors import describe, writing
from posttrain.storage.store import Store
from posttrain.values.trajectory import Trajectory

ROOT = Path(__file__).resolve().parents[1]


class Disk:
    """A 1 MiB tmpfs at `path`; `fill()` takes its last free byte, `free()` gives it back."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.filler = path / "filler"

    def fill(self) -> None:
        with open(self.filler, "ab", buffering=0) as f:
            try:
                while True:
                    f.write(b"\0" * 4096)
            except OSError as e:
                assert e.errno == errno.ENOSPC
        assert shutil.disk_usage(self.path).free < 4096

    def free(self) -> None:
        self.filler.unlink()


@pytest.fixture
def disk(tmp_path):
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("mounting a tmpfs needs root")
    path = tmp_path / "disk"
    path.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(path)]).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield Disk(path)
    finally:
        subprocess.run(["umount", "-l", str(path)])


def _traj(i: int, blob: bytes | None = None) -> tuple:
    from posttrain.values.task import sha256_text

    t = Trajectory(task_key="k", task_hash="h", domain="d", split="train", policy_version="v", status="completed",
                   reward=1.0, group_id=f"g{i}", run_id="r", final_workspace_sha256=sha256_text(blob) if blob else None)
    return (t, None, blob)


def test_the_store_names_itself_and_keeps_what_it_had(disk):
    path = disk.path / "store.sqlite"
    with Store(path) as store:
        store.put_trajectories([_traj(i) for i in range(3)])
        disk.fill()
        with pytest.raises(OSError) as info:  # a workspace archive that cannot fit
            store.put_trajectory(*_traj(9, os.urandom(64 * 1024)))
        assert describe(info.value) == (1, f"no space left on device (writing the store): {path}")
        disk.free()
        assert store.counts("r")["episodes"] == 3 and store.check() == []
        store.put_trajectory(*_traj(4))  # the connection is usable again (no transaction left open)
    with Store(path, readonly=True) as store:
        assert store.counts("r")["episodes"] == 4 and sum(store.duplicates().values()) == 0


def test_metrics_jsonl_names_itself_and_leaves_no_torn_line(disk):
    from posttrain.pipeline.metrics import MetricsLog

    log = MetricsLog(disk.path / "metrics.jsonl")
    assert log.write({"step": 1, "r": 0.1}) and log.write({"step": 2, "r": 0.2})
    disk.fill()
    with pytest.raises(OSError) as info:  # larger than the page the file has left
        log.write({"step": 3, "r": "x" * 20000})
    assert describe(info.value) == (1, f"no space left on device (writing metrics): {log.path}")
    disk.free()
    assert [json.loads(x)["step"] for x in log.path.read_text().splitlines()] == [1, 2]
    assert log.write({"step": 3, "r": 0.3})  # the step that failed is written when there is room


@pytest.mark.slow
def test_summary_eval_forgetting_and_report_files_name_themselves(disk, tmp_path):
    from posttrain.evaluation import EvalConfig, run_eval
    from posttrain.evaluation.contamination import check_contamination, guard_training
    from posttrain.evaluation.forgetting import write_forgetting
    from posttrain.evaluation.report import build_report
    from posttrain.evaluation.tasksets import resolve_tasks
    from posttrain.pipeline.main import _write_json
    from posttrain.policies.scripted import ScriptedPolicy

    result = run_eval(ScriptedPolicy.named("oracle"), resolve_tasks("math.add.d1", per_domain=40), EvalConfig(k=(1, 8)))
    tasks = resolve_tasks("math.add.d1", per_domain=40)
    contamination = check_contamination(tasks, tasks)  # a large report: every task collides
    (tmp_path / "run").mkdir()
    result.save_to_run(tmp_path / "run")  # a run to report on, off the full disk
    big = {"pad": "x" * 20000}
    disk.fill()
    expected = {
        "summary.json": lambda p: _write_json(p, big),
        "evals/before.json": lambda p: result.save(p),
        "forgetting/f.json": lambda p: write_forgetting(p.parent.parent, {**big, "after": "f"}, "f"),
        "report.html": lambda p: build_report(tmp_path / "run", out=p),
        "contamination.json": lambda p: guard_training(contamination, p.parent),
    }
    for name, write in expected.items():
        target = disk.path / name
        target.parent.mkdir(exist_ok=True)
        with pytest.raises(OSError) as info:
            write(target)
        code, line = describe(info.value)
        assert code == 1 and line.startswith("no space left on device") and line.endswith(f": {target}"), line
        assert not target.exists()
    disk.free()
    leftovers = [p.name for p in disk.path.rglob("*") if p.is_file()]
    assert leftovers == [], leftovers  # no temp files left behind


@pytest.mark.slow
def test_export_to_a_full_disk_is_one_line_and_exit_1(disk, tmp_path):
    run = tmp_path / "run"
    with Store.for_run_dir(run) as store:
        store.put_trajectories([_traj(i, os.urandom(256)) for i in range(200)])
    disk.fill()
    out = disk.path / "t.jsonl"
    done = subprocess.run([sys.executable, "-m", "posttrain.cli", "export", str(run), "--format", "jsonl",
                           "--out", str(out)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert done.returncode == 1, done.stderr
    assert done.stderr == f"error: no space left on device (exporting): {out}\n"
    assert not out.exists()


def test_a_refused_write_without_a_file_name_gets_one(tmp_path):
    # what a write() or flush() on a full disk raises: errno and words, no file name
    with pytest.raises(OSError) as info, writing(tmp_path / "a.json", "writing a"):
        raise OSError(errno.ENOSPC, "No space left on device")
    assert describe(info.value) == (1, f"no space left on device (writing a): {tmp_path / 'a.json'}")
    with pytest.raises(OSError) as info, writing(tmp_path / "b.json"):
        raise OSError(errno.EACCES, "Permission denied")
    assert describe(info.value) == (1, f"permission denied: {tmp_path / 'b.json'}")
    with pytest.raises(OSError) as info, writing(tmp_path / "c.json"):  # a named one keeps its name
        raise OSError(errno.EACCES, "Permission denied", "/elsewhere")
    assert describe(info.value) == (1, "permission denied: /elsewhere")
