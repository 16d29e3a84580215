"""The run store: SQLite in WAL mode, one file per run directory (`<run-dir>/store.sqlite`).

Why SQLite: it is in the standard library, crash-safe, and lets several worker processes append
at once (WAL: one writer at a time, readers never blocked). Every trajectory is written in a
single transaction together with its turns, its task and its workspace archive, so a crash never
leaves half of one visible. Scale-out exports the same rows to Parquet (`posttrain.storage.export`).

Tables: runs, tasks (full task, by content hash), trajectories (one row each, searchable
columns + the full record as JSON), turns, verdicts (the episode's verdict plus later re-scores),
blobs (zlib-compressed workspace archives by SHA-256), images (the images observations showed,
one row per SHA-256 however often they recur; turns refer to them by hash), policy_versions
(lineage).

Exactly once: a process may die at any point and a resumed run writes again what it had written
after its last checkpoint. Every row therefore has an identity and a second write of it changes
nothing: a trajectory is (run, group id, member, attempt) (a write of an identity already stored
is skipped, except that a trainable record replaces an `infra_error` one of the same identity);
a task is its content hash, a blob or an image its SHA-256, a run its id, a policy version its name.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
import zlib
from collections.abc import Collection, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from posttrain.errors import no_space
from posttrain.values.image import Image
from posttrain.values.task import Task, sha256_text
from posttrain.values.trajectory import Trajectory
from posttrain.values.verdict import Verdict

SCHEMA_VERSION = 2
STORE_FILE = "store.sqlite"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    id TEXT PRIMARY KEY, created_at REAL NOT NULL, config TEXT NOT NULL, meta TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS tasks (
    hash TEXT PRIMARY KEY, key TEXT NOT NULL, domain TEXT NOT NULL, split TEXT NOT NULL,
    body TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS trajectories (
    id TEXT PRIMARY KEY, run_id TEXT NOT NULL, task_hash TEXT NOT NULL, task_key TEXT NOT NULL,
    domain TEXT NOT NULL, split TEXT NOT NULL, group_id TEXT NOT NULL, attempt INTEGER NOT NULL,
    policy_version TEXT NOT NULL, status TEXT NOT NULL, reward REAL, passed INTEGER,
    n_turns INTEGER NOT NULL, created_at REAL NOT NULL, body TEXT NOT NULL,
    member INTEGER NOT NULL DEFAULT 0);
CREATE INDEX IF NOT EXISTS traj_run ON trajectories (run_id, domain, status);
CREATE INDEX IF NOT EXISTS traj_group ON trajectories (run_id, group_id);
CREATE TABLE IF NOT EXISTS turns (
    trajectory_id TEXT NOT NULL, idx INTEGER NOT NULL, body TEXT NOT NULL,
    PRIMARY KEY (trajectory_id, idx));
CREATE TABLE IF NOT EXISTS verdicts (
    id INTEGER PRIMARY KEY AUTOINCREMENT, trajectory_id TEXT NOT NULL, kind TEXT NOT NULL,
    verifier_version TEXT NOT NULL, passed INTEGER NOT NULL, score REAL NOT NULL,
    details TEXT NOT NULL, created_at REAL NOT NULL);
CREATE INDEX IF NOT EXISTS verdict_traj ON verdicts (trajectory_id);
CREATE TABLE IF NOT EXISTS blobs (sha256 TEXT PRIMARY KEY, data BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS images (sha256 TEXT PRIMARY KEY, mime TEXT NOT NULL, data BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS policy_versions (
    name TEXT PRIMARY KEY, parent TEXT, weights_hash TEXT NOT NULL, path TEXT,
    created_at REAL NOT NULL, meta TEXT NOT NULL);
"""


# A trajectory's identity; episodes outside any group (group_id '') are identified by id alone.
_IDENTITY_INDEX = ("CREATE {unique} INDEX IF NOT EXISTS {name} ON trajectories "
                   "(run_id, group_id, member, attempt) WHERE group_id != ''")


def _is_busy(e: sqlite3.Error) -> bool:
    """SQLite's answer when another connection holds the lock it needs."""
    return "locked" in str(e) or "busy" in str(e)


class StoreError(RuntimeError):
    """The store cannot be used (corrupt file, locked too long, wrong schema); names the file."""


class Store:
    def __init__(self, path: str | Path, *, timeout_s: float = 60.0, readonly: bool = False) -> None:
        self.path = Path(path)
        if readonly and not self.path.exists():
            raise StoreError(f"{self.path}: no store here (was anything run in this directory?)")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            uri = f"file:{self.path}?mode=ro" if readonly else f"file:{self.path}"
            self._db = sqlite3.connect(uri, uri=True, timeout=timeout_s, isolation_level=None,
                                       check_same_thread=False)
            self._db.execute(f"PRAGMA busy_timeout = {int(timeout_s * 1000)}")
            row = self._open(readonly, time.monotonic() + timeout_s)
        except sqlite3.DatabaseError as e:
            raise self._refusal(e) from e
        if row is None or int(row[0]) != SCHEMA_VERSION:
            raise StoreError(f"{self.path}: store schema version {row and row[0]} is not "
                             f"{SCHEMA_VERSION}; export it with the posttrain version that wrote it")

    def _open(self, readonly: bool, deadline: float) -> Any:
        """Set the store up (WAL, schema, migration) and return its schema-version row.

        Several processes may open a new store at the same instant. SQLite answers some of the
        steps of that race (switching a fresh file to WAL, the first read of a WAL file whose
        shared memory another connection is initialising) with SQLITE_BUSY at once, without
        calling the busy handler, so `busy_timeout` alone does not cover them. Every step is
        idempotent, so a busy answer is retried (with a growing pause) until the caller's timeout.
        """
        pause = 0.005
        while True:
            try:
                if not readonly:
                    self._db.execute("PRAGMA journal_mode = WAL")
                    self._db.execute("PRAGMA synchronous = NORMAL")
                    self._db.executescript(_SCHEMA)
                    self._db.execute("INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)",
                                     (str(SCHEMA_VERSION),))
                    self._migrate()
                return self._db.execute(
                    "SELECT value FROM meta WHERE key='schema_version'").fetchone()
            except sqlite3.OperationalError as e:
                if not _is_busy(e) or time.monotonic() + pause > deadline:
                    raise
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                time.sleep(pause)
                pause = min(pause * 2, 0.25)

    def _migrate(self) -> None:
        """Schema 1 -> 2: trajectories get their `member` (0 for old rows) and the identity index."""
        row = self._db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        if row is not None and int(row[0]) == 1:
            cols = {r[1] for r in self._db.execute("PRAGMA table_info(trajectories)")}
            if "member" not in cols:
                self._db.execute("ALTER TABLE trajectories ADD COLUMN member INTEGER NOT NULL DEFAULT 0")
            self._db.execute("UPDATE meta SET value=? WHERE key='schema_version'", (str(SCHEMA_VERSION),))
        try:  # a store of schema 1 may already hold duplicates: then the index cannot be unique
            self._db.execute(_IDENTITY_INDEX.format(unique="UNIQUE", name="traj_identity"))
        except sqlite3.IntegrityError:
            self._db.execute(_IDENTITY_INDEX.format(unique="", name="traj_identity_legacy"))

    @classmethod
    def for_run_dir(cls, run_dir: str | Path, **kwargs: Any) -> Store:
        return cls(Path(run_dir) / STORE_FILE, **kwargs)

    def _refusal(self, e: sqlite3.Error) -> Exception:
        """The error to raise for a failed SQLite call: a full disk is the environment's refusal,
        said as `no space left on device (writing the store): PATH` (what SQLite says, "database
        or disk is full", names no file); anything else is a `StoreError` naming the store."""
        full = getattr(e, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL or "disk is full" in str(e)
        if full:
            return no_space(self.path, "writing the store")
        return StoreError(self._explain(e))

    def _explain(self, e: sqlite3.Error) -> str:
        msg = str(e)
        if _is_busy(e):
            return (f"{self.path}: the store stayed locked by another process past the timeout "
                    f"({msg}); is another posttrain process holding it?")
        if "not a database" in msg or "malformed" in msg or "corrupt" in msg:
            return (f"{self.path}: the store file is corrupt ({msg}); restore it from a backup or "
                    "start a new run directory — nothing was written to it")
        return f"{self.path}: {msg}"

    def _tx(self, fn, *args: Any) -> Any:
        """Run `fn(cursor, *args)` in one IMMEDIATE transaction (all or nothing)."""
        try:
            cur = self._db.cursor()
            cur.execute("BEGIN IMMEDIATE")
            try:
                out = fn(cur, *args)
                cur.execute("COMMIT")
            except BaseException:
                # a COMMIT that failed (a full disk) leaves the transaction open, unless SQLite
                # rolled it back itself: either way none of it is stored, and the next one can begin
                if self._db.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        cur.execute("ROLLBACK")
                raise
            return out
        except sqlite3.Error as e:
            raise self._refusal(e) from e

    def _query(self, sql: str, params: tuple = ()) -> list[tuple]:
        try:
            return self._db.execute(sql, params).fetchall()
        except sqlite3.Error as e:
            raise StoreError(self._explain(e)) from e

    # -- writes ---------------------------------------------------------------------------
    def start_run(self, run_id: str, config: Mapping[str, Any], meta: Mapping[str, Any] | None = None) -> None:
        # a resumed run keeps its first creation time (one row per run id, however often started)
        self._tx(lambda c: c.execute("INSERT INTO runs VALUES (?,?,?,?) ON CONFLICT(id) DO UPDATE SET "
                                     "config=excluded.config, meta=excluded.meta",
                                     (run_id, time.time(), json.dumps(config, default=str),
                                      json.dumps(meta or {}, default=str))))

    def put_trajectory(self, traj: Trajectory, task: Task | None = None,
                       workspace: bytes | None = None) -> None:
        """Write a trajectory, its turns, its verdict, its task and its workspace atomically."""
        self.put_trajectories([(traj, task, workspace)])

    def put_trajectories(self, items: Sequence[tuple[Trajectory, Task | None, bytes | None]]) -> None:
        """Write several trajectories (e.g. a whole GRPO group) in one transaction: after a crash
        either all of them are stored or none. A trajectory whose identity (run, group, member,
        attempt) is already stored is skipped (a resumed run writing again what it had written),
        unless the stored one is an `infra_error` and this one is not: then this one replaces it."""
        rows = []
        for traj, task, workspace in items:
            if workspace is not None and traj.final_workspace_sha256 is None:
                raise ValueError(f"trajectory {traj.id}: a workspace archive was given but the "
                                 "trajectory has no final_workspace_sha256")
            body = traj.to_dict()
            rows.append((traj, task, workspace, body, body.pop("turns")))

        def write(c: sqlite3.Cursor) -> None:
            for traj, task, workspace, body, turns in rows:
                if not self._claim(c, traj):
                    continue
                if task is not None:
                    c.execute("INSERT OR IGNORE INTO tasks VALUES (?,?,?,?,?)",
                              (task.hash, task.key, task.domain, task.split, task.model_dump_json()))
                if workspace is not None:
                    c.execute("INSERT OR IGNORE INTO blobs VALUES (?,?)",
                              (traj.final_workspace_sha256, zlib.compress(workspace, 6)))
                c.execute("INSERT INTO trajectories VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                          (traj.id, traj.run_id, traj.task_hash, traj.task_key, traj.domain, traj.split,
                           traj.group_id, traj.attempt, traj.policy_version, traj.status, traj.reward,
                           None if traj.passed is None else int(traj.passed), len(turns),
                           traj.created_at or time.time(), json.dumps(body, default=str), traj.member))
                c.executemany("INSERT INTO turns VALUES (?,?,?)",
                              [(traj.id, t["index"], json.dumps(t)) for t in turns])
                # PNG/JPEG are compressed already: stored as they are, once per hash
                c.executemany("INSERT OR IGNORE INTO images VALUES (?,?,?)",
                              [(img.sha256, img.mime, img.data) for img in traj.images.values()])
                if traj.verdict is not None:
                    self._insert_verdict(c, traj.id, traj.verdict, "episode")

        self._tx(write)

    @staticmethod
    def _claim(c: sqlite3.Cursor, traj: Trajectory) -> bool:
        """Whether `traj` is to be written: its id and identity are free, or its identity holds
        an infra_error that this trainable record supersedes (which is then deleted)."""
        if c.execute("SELECT 1 FROM trajectories WHERE id=?", (traj.id,)).fetchone():
            return False
        if not traj.group_id:
            return True
        row = c.execute("SELECT id, status FROM trajectories WHERE run_id=? AND group_id=? AND member=? "
                        "AND attempt=?", (traj.run_id, traj.group_id, traj.member, traj.attempt)).fetchone()
        if row is None:
            return True
        if row[1] != "infra_error" or traj.status == "infra_error":
            return False
        for table, col in (("turns", "trajectory_id"), ("verdicts", "trajectory_id"), ("trajectories", "id")):
            c.execute(f"DELETE FROM {table} WHERE {col}=?", (row[0],))
        return True

    @staticmethod
    def _insert_verdict(c: sqlite3.Cursor, traj_id: str, v: Verdict, kind: str) -> None:
        c.execute("INSERT INTO verdicts (trajectory_id, kind, verifier_version, passed, score, details, "
                  "created_at) VALUES (?,?,?,?,?,?,?)",
                  (traj_id, kind, v.verifier_version, int(v.passed), v.score,
                   json.dumps(dict(v.details), default=str), time.time()))

    def put_verdict(self, traj_id: str, verdict: Verdict, kind: str = "rescore") -> None:
        self._tx(self._insert_verdict, traj_id, verdict, kind)

    def put_policy_version(self, name: str, parent: str | None, weights_hash: str,
                           path: str | None = None, meta: Mapping[str, Any] | None = None) -> None:
        self._tx(lambda c: c.execute("INSERT INTO policy_versions VALUES (?,?,?,?,?,?) ON CONFLICT(name) "
                                     "DO UPDATE SET parent=excluded.parent, weights_hash=excluded.weights_hash, "
                                     "path=excluded.path, meta=excluded.meta",
                                     (name, parent, weights_hash, path, time.time(),
                                      json.dumps(meta or {}, default=str))))

    def delete_run(self, run_id: str) -> int:
        """Remove a run's trajectories (turns and verdicts with them) and its row, in one
        transaction; returns how many trajectories went. For a result that was superseded (an
        evaluation of weights a resumed run has since trained further)."""
        def delete(c: sqlite3.Cursor) -> int:
            ids = "SELECT id FROM trajectories WHERE run_id=?"
            c.execute(f"DELETE FROM turns WHERE trajectory_id IN ({ids})", (run_id,))
            c.execute(f"DELETE FROM verdicts WHERE trajectory_id IN ({ids})", (run_id,))
            n = c.execute("DELETE FROM trajectories WHERE run_id=?", (run_id,)).rowcount
            c.execute("DELETE FROM runs WHERE id=?", (run_id,))
            return n

        return self._tx(delete)

    def delete_run_tasks(self, run_id: str, task_hashes: Collection[str]) -> int:
        """Remove the trajectories of `run_id` (turns and verdicts with them) that are of the
        tasks `task_hashes`, in one transaction; returns how many went. For an evaluation asked
        for again over a changed task set: the samples of the tasks it still has are kept."""
        hashes = sorted(set(task_hashes))

        def delete(c: sqlite3.Cursor) -> int:
            n = 0
            for i in range(0, len(hashes), 500):  # under SQLite's bound-parameter limit
                part = hashes[i:i + 500]
                ids = f"SELECT id FROM trajectories WHERE run_id=? AND task_hash IN ({','.join('?' * len(part))})"
                c.execute(f"DELETE FROM turns WHERE trajectory_id IN ({ids})", (run_id, *part))
                c.execute(f"DELETE FROM verdicts WHERE trajectory_id IN ({ids})", (run_id, *part))
                n += c.execute(f"DELETE FROM trajectories WHERE run_id=? AND task_hash IN "
                               f"({','.join('?' * len(part))})", (run_id, *part)).rowcount
            return n

        return self._tx(delete)

    # -- reads ----------------------------------------------------------------------------
    def get_task(self, task_hash: str) -> Task:
        rows = self._query("SELECT body FROM tasks WHERE hash=?", (task_hash,))
        if not rows:
            raise KeyError(f"{self.path}: no task with hash {task_hash}")
        return Task.model_validate_json(rows[0][0])

    def get_blob(self, sha256: str) -> bytes:
        rows = self._query("SELECT data FROM blobs WHERE sha256=?", (sha256,))
        if not rows:
            raise KeyError(f"{self.path}: no blob {sha256}")
        data = zlib.decompress(rows[0][0])
        if sha256_text(data) != sha256:
            raise StoreError(f"{self.path}: blob {sha256} does not match its hash (corrupt store)")
        return data

    def get_image(self, sha256: str) -> Image:
        rows = self._query("SELECT mime, data FROM images WHERE sha256=?", (sha256,))
        if not rows:
            raise KeyError(f"{self.path}: no image {sha256}")
        try:
            return Image(bytes(rows[0][1]), rows[0][0], sha256)
        except ValueError as e:
            raise StoreError(f"{self.path}: image {sha256} is corrupt ({e})") from e

    def image_stats(self) -> dict[str, int]:
        """{'images': distinct images stored, 'bytes': their size, 'refs': turn references}."""
        n, size = self._query("SELECT COUNT(*), COALESCE(SUM(LENGTH(data)), 0) FROM images")[0]
        refs = sum(len(json.loads(b).get("observation_images") or [])
                   for (b,) in self._query("SELECT body FROM turns WHERE body LIKE '%\"sha256\"%'"))
        return {"images": int(n), "bytes": int(size), "refs": refs}

    def image_trajectory_ids(self, limit: int = 10) -> list[str]:
        """Ids of up to `limit` stored trajectories that showed images (oldest first)."""
        return [i for (i,) in self._query(
            "SELECT id FROM trajectories WHERE id IN (SELECT trajectory_id FROM turns WHERE body LIKE "
            "'%\"observation_images\": [{%') ORDER BY created_at, id LIMIT ?", (limit,))]

    def _load(self, row: tuple) -> Trajectory:
        traj_id, body = row
        d = json.loads(body)
        d["turns"] = [json.loads(b) for (b,) in self._query(
            "SELECT body FROM turns WHERE trajectory_id=? ORDER BY idx", (traj_id,))]
        traj = Trajectory.from_dict(d)
        for turn in traj.turns:
            for ref in turn.observation_images:
                if ref["sha256"] not in traj.images:
                    traj.images[ref["sha256"]] = self.get_image(ref["sha256"])
        return traj

    def get_trajectory(self, traj_id: str) -> Trajectory:
        rows = self._query("SELECT id, body FROM trajectories WHERE id=? OR id LIKE ?",
                           (traj_id, traj_id + "%"))
        if len(rows) != 1:
            raise KeyError(f"{self.path}: {'no' if not rows else 'more than one'} trajectory "
                           f"matches id {traj_id!r}")
        return self._load(rows[0])

    def trajectories(self, *, run_id: str | None = None, domain: str | None = None,
                     status: str | None = None, split: str | None = None,
                     group_id: str | None = None) -> Iterator[Trajectory]:
        where, params = [], []
        for col, val in (("run_id", run_id), ("domain", domain), ("status", status), ("split", split),
                         ("group_id", group_id)):
            if val is not None:
                where.append(f"{col}=?")
                params.append(val)
        sql = "SELECT id, body FROM trajectories" + (" WHERE " + " AND ".join(where) if where else "")
        for row in self._query(sql + " ORDER BY created_at, id", tuple(params)):
            yield self._load(row)

    def verdicts(self, traj_id: str) -> list[dict[str, Any]]:
        rows = self._query("SELECT kind, verifier_version, passed, score, details, created_at FROM "
                           "verdicts WHERE trajectory_id=? ORDER BY id", (traj_id,))
        return [{"kind": k, "verifier_version": v, "passed": bool(p), "score": s,
                 "details": json.loads(d), "created_at": t} for k, v, p, s, d, t in rows]

    def counts(self, run_id: str | None = None) -> dict[str, int]:
        sql = "SELECT status, COUNT(*), SUM(COALESCE(passed, 0)) FROM trajectories"
        rows = self._query(sql + (" WHERE run_id=? GROUP BY status" if run_id else " GROUP BY status"),
                           (run_id,) if run_id else ())
        out = {"episodes": 0, "completed": 0, "truncated": 0, "infra_error": 0, "passed": 0}
        for status, n, passed in rows:
            out[status] = n
            out["episodes"] += n
            out["passed"] += int(passed or 0)
        return out

    def group_ids(self, run_id: str, *, trainable_only: bool = True) -> set[str]:
        sql = "SELECT DISTINCT group_id FROM trajectories WHERE run_id=? AND group_id != ''"
        if trainable_only:
            sql += " AND status IN ('completed', 'truncated')"
        return {g for (g,) in self._query(sql, (run_id,))}

    def run_policy_versions(self, run_id: str) -> set[str]:
        """The policy versions that drew the stored trajectories of `run_id`."""
        return {v for (v,) in self._query("SELECT DISTINCT policy_version FROM trajectories WHERE run_id=?",
                                          (run_id,))}

    def run_task_hashes(self, run_id: str) -> set[str]:
        """The tasks of the stored trajectories of `run_id`."""
        return {h for (h,) in self._query("SELECT DISTINCT task_hash FROM trajectories WHERE run_id=?", (run_id,))}

    def infra_attempts(self, run_id: str) -> dict[tuple[str, int], int]:
        """(group id, member) -> the highest attempt recorded as `infra_error` (a resumed run
        moves such members on to their next attempt, as the interrupted run would have)."""
        rows = self._query("SELECT group_id, member, MAX(attempt) FROM trajectories WHERE run_id=? "
                           "AND status='infra_error' AND group_id != '' GROUP BY group_id, member", (run_id,))
        return {(g, int(m)): int(a) for g, m, a in rows}

    def duplicates(self) -> dict[str, int]:
        """Rows beyond one per identity, per table (0 everywhere in a healthy store)."""
        queries = {
            "trajectories": "SELECT COALESCE(SUM(n - 1), 0) FROM (SELECT COUNT(*) n FROM trajectories "
                            "WHERE group_id != '' GROUP BY run_id, group_id, member, attempt)",
            "turns": "SELECT COALESCE(SUM(n - 1), 0) FROM (SELECT COUNT(*) n FROM turns GROUP BY trajectory_id, idx)",
            "episode_verdicts": "SELECT COALESCE(SUM(n - 1), 0) FROM (SELECT COUNT(*) n FROM verdicts "
                                "WHERE kind='episode' GROUP BY trajectory_id)",
            "runs": "SELECT COUNT(*) - COUNT(DISTINCT id) FROM runs",
            "policy_versions": "SELECT COUNT(*) - COUNT(DISTINCT name) FROM policy_versions",
        }
        return {k: int(self._query(q)[0][0]) for k, q in queries.items()}

    def runs(self) -> list[dict[str, Any]]:
        return [{"id": i, "created_at": t, "config": json.loads(c), "meta": json.loads(m)}
                for i, t, c, m in self._query("SELECT * FROM runs ORDER BY created_at")]

    def policy_versions(self) -> list[dict[str, Any]]:
        rows = self._query("SELECT name, parent, weights_hash, path, created_at, meta FROM "
                           "policy_versions ORDER BY created_at")
        return [{"name": n, "parent": p, "weights_hash": w, "path": pa, "created_at": t,
                 "meta": json.loads(m)} for n, p, w, pa, t, m in rows]

    def check(self) -> list[str]:
        """Integrity problems (empty when the store is consistent)."""
        problems = [r[0] for r in self._query("PRAGMA integrity_check") if r[0] != "ok"]
        for traj_id, n_turns, count in self._query(
                "SELECT t.id, t.n_turns, (SELECT COUNT(*) FROM turns u WHERE u.trajectory_id = t.id) "
                "FROM trajectories t"):
            if n_turns != count:
                problems.append(f"trajectory {traj_id}: {count} of {n_turns} turns stored")
        return problems

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
