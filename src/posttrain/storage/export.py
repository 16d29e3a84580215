"""Export stored trajectories to Parquet (one row per trajectory) or JSONL (the full record).

The Parquet file loads with `pyarrow.parquet.read_table` and with
`datasets.load_dataset("parquet", data_files=PATH)`: flat columns for filtering, per-turn lists
for training (`actions`, `token_ids`, `logprobs`), and the complete record as JSON in `record`.
Image episodes carry their images: `turn_images` (per turn, the SHA-256 of each image shown with
its observation) and `images` (each distinct image of the trajectory once: sha256, mime, the
PNG/JPEG bytes), so a row is self-contained for a vision-language trainer. Across rows an image
recurs (the store keeps it once; a Parquet file of G samples of one task holds it G times).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from posttrain.storage.store import Store
from posttrain.values.trajectory import Trajectory


def _row(t: Trajectory) -> dict:
    return {
        "id": t.id, "run_id": t.run_id, "domain": t.domain, "task_key": t.task_key,
        "task_hash": t.task_hash, "split": t.split, "group_id": t.group_id, "attempt": t.attempt,
        "policy_version": t.policy_version, "status": t.status, "reward": t.reward,
        "passed": t.passed, "verifier_version": t.verifier_version,
        "n_turns": len(t.turns),
        "prompt": t.turns[0].observation if t.turns else "",
        "actions": [u.action for u in t.turns],
        "token_ids": [u.token_ids or [] for u in t.turns],
        "logprobs": [u.logprobs or [] for u in t.turns],
        "error": json.dumps(t.to_dict()["error"]) if t.error else None,
        "turn_images": [[r["sha256"] for r in u.observation_images] for u in t.turns],
        "images": [{"sha256": img.sha256, "mime": img.mime, "data": img.data}
                   for img in sorted(t.images.values(), key=lambda i: i.sha256)],
        "record": json.dumps(t.to_dict(), default=str),
    }


def export_parquet(trajectories: Iterable[Trajectory], out: str | Path) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [_row(t) for t in trajectories]
    schema = pa.schema([
        ("id", pa.string()), ("run_id", pa.string()), ("domain", pa.string()),
        ("task_key", pa.string()), ("task_hash", pa.string()), ("split", pa.string()),
        ("group_id", pa.string()), ("attempt", pa.int32()), ("policy_version", pa.string()),
        ("status", pa.string()), ("reward", pa.float64()), ("passed", pa.bool_()),
        ("verifier_version", pa.string()), ("n_turns", pa.int32()), ("prompt", pa.string()),
        ("actions", pa.list_(pa.string())), ("token_ids", pa.list_(pa.list_(pa.int64()))),
        ("logprobs", pa.list_(pa.list_(pa.float64()))), ("error", pa.string()),
        ("turn_images", pa.list_(pa.list_(pa.string()))),
        ("images", pa.list_(pa.struct([("sha256", pa.string()), ("mime", pa.string()), ("data", pa.binary())]))),
        ("record", pa.string()),
    ])
    table = pa.Table.from_pylist(rows, schema=schema)
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, str(out))
    return len(rows)


def export_jsonl(trajectories: Iterable[Trajectory], out: str | Path) -> int:
    n = 0
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        for t in trajectories:
            f.write(json.dumps(t.to_dict(), default=str) + "\n")
            n += 1
    return n


def export_store(store: Store, out: str | Path, fmt: str, run_id: str | None = None) -> int:
    if fmt not in ("parquet", "jsonl"):
        raise ValueError(f"--format must be 'parquet' or 'jsonl', got {fmt!r}")
    trajs = store.trajectories(run_id=run_id)
    return export_parquet(trajs, out) if fmt == "parquet" else export_jsonl(trajs, out)
