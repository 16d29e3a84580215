import json
import os
import signal
import subprocess
import sys
import time

import pytest

from posttrain.policies.scripted import ScriptedPolicy
from posttrain.scheduling.engine import run_episodes
from posttrain.storage.export import export_store
from posttrain.storage.store import Store, StoreError
from tests.toydomains import CrashingVerifier, add_domain

DOMAINS = {"toy.add": add_domain(), "toy.crash": add_domain("toy.crash", CrashingVerifier())}


def _trajs(n=3, policy="oracle"):
    specs = [(DOMAINS["toy.add"], DOMAINS["toy.add"].task(i)) for i in range(n)]
    specs.append((DOMAINS["toy.crash"], DOMAINS["toy.crash"].task(0)))
    return specs, run_episodes(specs, ScriptedPolicy.named(policy), run_id="r1")


def test_roundtrip_and_counts(tmp_path):
    specs, trajs = _trajs()
    with Store.for_run_dir(tmp_path) as store:
        store.start_run("r1", {"k": 1})
        for (_d, task), t in zip(specs, trajs):
            store.put_trajectory(t, task)
        assert store.counts("r1") == {"episodes": 4, "completed": 3, "truncated": 0,
                                      "infra_error": 1, "passed": 3}
        back = store.get_trajectory(trajs[0].id[:10])
        assert back.to_dict() == trajs[0].to_dict()
        assert store.get_task(trajs[0].task_hash) == specs[0][1]
        assert store.verdicts(trajs[0].id)[0]["kind"] == "episode"
        assert store.check() == []
        err = store.get_trajectory(trajs[3].id)
        assert err.status == "infra_error" and err.reward is None and err.error.where == "verifier"


def test_delete_run_tasks_removes_only_those_tasks_of_that_run(tmp_path):
    specs, trajs = _trajs()
    with Store.for_run_dir(tmp_path) as store:
        for (_d, task), t in zip(specs, trajs):
            store.put_trajectory(t, task)
        gone = {trajs[0].task_hash, trajs[3].task_hash}
        # more hashes than one statement binds (chunked), most of them not in the store
        assert store.delete_run_tasks("r1", [*gone, *(f"{i:064x}" for i in range(1200))]) == 2
        assert store.delete_run_tasks("other-run", [trajs[1].task_hash]) == 0
        assert store.run_task_hashes("r1") == {trajs[1].task_hash, trajs[2].task_hash}
        assert store.verdicts(trajs[0].id) == [] and store.counts("r1")["episodes"] == 2
        assert store.check() == []


def test_parquet_and_jsonl_export_roundtrip(tmp_path):
    specs, trajs = _trajs()
    with Store.for_run_dir(tmp_path) as store:
        for (_d, task), t in zip(specs, trajs):
            store.put_trajectory(t, task)
        assert export_store(store, tmp_path / "t.parquet", "parquet") == 4
        assert export_store(store, tmp_path / "t.jsonl", "jsonl") == 4
        with pytest.raises(ValueError, match="parquet"):
            export_store(store, tmp_path / "x", "csv")
    import pyarrow.parquet as pq
    table = pq.read_table(tmp_path / "t.parquet")
    rows = {r["id"]: r for r in table.to_pylist()}
    assert rows[trajs[0].id]["actions"] == [trajs[0].turns[0].action]
    assert rows[trajs[3].id]["status"] == "infra_error" and rows[trajs[3].id]["reward"] is None
    assert json.loads(rows[trajs[1].id]["record"])["task_hash"] == trajs[1].task_hash
    import datasets
    ds = datasets.load_dataset("parquet", data_files=str(tmp_path / "t.parquet"), split="train")
    assert len(ds) == 4 and set(ds["domain"]) == {"toy.add", "toy.crash"}
    lines = (tmp_path / "t.jsonl").read_text().splitlines()
    assert {json.loads(x)["id"] for x in lines} == set(rows)


WRITER = r"""
import sys, time
sys.path.insert(0, {root!r})
from posttrain.policies.scripted import ScriptedPolicy
from posttrain.scheduling.engine import run_episodes
from posttrain.storage.store import Store
from tests.toydomains import add_domain
d = add_domain()
store = Store({path!r})
i = 0
while i < {n}:
    (t,) = run_episodes([(d, d.task(i))], ScriptedPolicy.oracle(), run_id={run!r})
    store.put_trajectory(t, d.task(i))
    i += 1
    print(i, flush=True)
"""


def _writer(tmp_path, run, n):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = WRITER.format(root=root, path=str(tmp_path / "store.sqlite"), n=n, run=run)
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_concurrent_writer_processes(tmp_path):
    procs = [_writer(tmp_path, f"w{i}", 25) for i in range(3)]
    for p in procs:
        assert p.wait(timeout=120) == 0
    with Store.for_run_dir(tmp_path) as store:
        for i in range(3):
            assert store.counts(f"w{i}")["completed"] == 25
        assert store.check() == []


def _open_at_once(path, barrier, results):
    barrier.wait()
    try:
        Store(path).close()
        results.put("ok")
    except Exception as e:  # noqa: BLE001 - reported to the test
        results.put(repr(e))


@pytest.mark.slow
def test_processes_opening_a_new_store_at_the_same_instant_all_get_it(tmp_path):
    # SQLite answers some steps of this race (a fresh file switched to WAL, the first read of a WAL
    # file another connection is setting up) with SQLITE_BUSY at once, busy_timeout or not; before
    # the store retried them, about 1 open in 30 failed here with "the store stayed locked"
    import multiprocessing as mp
    ctx = mp.get_context("fork")
    for trial in range(30):
        barrier, results = ctx.Barrier(6), ctx.Queue()
        path = tmp_path / f"s{trial}" / "store.sqlite"
        procs = [ctx.Process(target=_open_at_once, args=(path, barrier, results)) for _ in range(6)]
        for p in procs:
            p.start()
        got = [results.get(timeout=60) for _ in procs]
        for p in procs:
            p.join()
        assert got == ["ok"] * 6, got


def test_process_killed_mid_write_leaves_store_consistent(tmp_path):
    p = _writer(tmp_path, "k", 100000)
    for _ in range(20):  # let it write for a while
        p.stdout.readline()
    p.send_signal(signal.SIGKILL)
    p.wait()
    with Store.for_run_dir(tmp_path) as store:
        assert store.check() == []
        n = store.counts("k")["completed"]
        assert n >= 20
        for t in store.trajectories(run_id="k"):
            assert len(t.turns) == 1 and t.verdict is not None


def test_corrupt_and_missing_store_give_clear_errors(tmp_path):
    bad = tmp_path / "store.sqlite"
    bad.write_bytes(b"this is not sqlite at all" * 100)
    with pytest.raises(StoreError, match="corrupt"):
        Store(bad)
    assert bad.read_bytes().startswith(b"this is not sqlite")  # nothing overwritten
    with pytest.raises(StoreError, match="no store here"):
        Store(tmp_path / "nope" / "store.sqlite", readonly=True)


def test_locked_store_times_out_with_message(tmp_path):
    import sqlite3
    path = tmp_path / "store.sqlite"
    Store(path).close()
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    _, trajs = _trajs(1)
    try:
        t0 = time.time()
        with pytest.raises(StoreError, match="locked"):
            Store(path, timeout_s=0.3).put_trajectory(trajs[0])
        assert time.time() - t0 < 10
    finally:
        holder.execute("ROLLBACK")
        holder.close()
