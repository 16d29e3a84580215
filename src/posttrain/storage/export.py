"""Export stored trajectories to Parquet (one row per trajectory) or JSONL (the full record).

The Parquet file loads with `pyarrow.parquet.read_table` and with
`datasets.load_dataset("parquet", data_files=PATH)`: flat columns for filtering, per-turn lists
for training (`actions`, `token_ids`, `logprobs`), and the complete record as JSON in `record`.
Image episodes refer to their images by SHA-256: `turn_images` (per turn, the hash of each image
shown with its observation). The bytes are in the file once per hash, however many rows show
the image (a GRPO group of G samples shows one chart G times): `images` of a row holds the images
*first* shown by that row (sha256, mime, the PNG/JPEG bytes), in file order, so a reader collects
them over the whole file (`read_images`) and looks each reference up. A row alone is therefore not
self-contained; a file is.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from posttrain.storage.store import Store
from posttrain.values.image import Image
from posttrain.values.trajectory import Trajectory


def _row(t: Trajectory, written: set[str]) -> dict:
    """`t` as a row; `written`: the image hashes earlier rows carry (updated with this row's)."""
    new = sorted((img for img in t.images.values() if img.sha256 not in written), key=lambda i: i.sha256)
    written.update(img.sha256 for img in new)
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
        "images": [{"sha256": img.sha256, "mime": img.mime, "data": img.data} for img in new],
        "record": json.dumps(t.to_dict(), default=str),
    }


def export_parquet(trajectories: Iterable[Trajectory], out: str | Path) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    written: set[str] = set()
    rows = [_row(t, written) for t in trajectories]
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


def read_images(path: str | Path) -> dict[str, Image]:
    """Every image of a Parquet export by SHA-256 (what its rows' `turn_images` refer to); the
    hash of each is checked against its bytes (`Image` refuses a mismatch)."""
    import pyarrow.parquet as pq

    out: dict[str, Image] = {}
    for images in pq.read_table(str(path), columns=["images"]).column("images").to_pylist():
        for img in images or ():
            out[img["sha256"]] = Image(img["data"], img["mime"], img["sha256"])
    return out


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
