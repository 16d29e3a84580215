"""Exports other trainers read: verl's prompt files, TRL datasets, a rejection-sampling SFT set.

`posttrain export RUN --format verl|trl|sft [--passed-only] --out FILE.parquet|FILE.jsonl`

* `verl`: verl's RL prompt schema (what its `RLHFDataset` and reward functions read), one row per
  stored trajectory: `data_source` (the domain), `prompt` (chat messages: what the policy was
  first shown), `ability` (the family), `reward_model` `{style: "rule", ground_truth}` (the
  task's reference answer as text; JSON for structured references) and `extra_info` (index,
  split, trajectory id, task key and hash, reward, passed, status).
* `trl`: TRL's prompt-completion format with a `reward` column, one row per trainable trajectory
  (completed or truncated: an infrastructure error has no reward). Standard (`prompt` and
  `completion` are text) when every episode is one turn; *conversational* (both are lists of
  `{role, content}` messages, the completion holding every later turn with the observations
  between them as user messages) when any episode has several turns, since a column has one type.
* `sft`: a supervised set in the `messages` format (user, assistant, ...), one row per trainable
  trajectory, or per passed one with `--passed-only` (rejection-sampling fine-tuning).

Every row carries `trajectory_id`, so it maps back to the store (`posttrain replay RUN ID`), and
the number of rows is the number of trajectories the filter selects (`Store.counts`). `.parquet`
files load with `datasets.load_dataset("parquet", data_files=...)`, `.jsonl` with
`load_dataset("json", ...)`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from posttrain.storage.store import Store
from posttrain.values.task import canonical_json
from posttrain.values.trajectory import Trajectory

FORMATS = ("verl", "trl", "sft")


def conversation(t: Trajectory) -> list[dict[str, str]]:
    """The episode as chat messages: the first observation, then each action and what followed."""
    out: list[dict[str, str]] = []
    for turn in t.turns:
        out.append({"role": "user", "content": turn.observation})
        out.append({"role": "assistant", "content": turn.action})
    return out


def ground_truth(store: Store, t: Trajectory) -> str | None:
    """The task's reference answer as text (verl's reward functions compare with it)."""
    try:
        reference = store.get_task(t.task_hash).reference
    except KeyError:
        return None
    if isinstance(reference, dict) and "answer" in reference:
        reference = reference["answer"]
    return reference if isinstance(reference, str) else canonical_json(reference)


def _first_prompt(store: Store, t: Trajectory) -> str:
    if t.turns:
        return t.turns[0].observation
    try:
        return store.get_task(t.task_hash).prompt  # an episode that failed before its first turn
    except KeyError:
        return ""


def verl_rows(store: Store, trajs: Iterable[Trajectory]) -> list[dict[str, Any]]:
    return [{"data_source": t.domain,
             "prompt": [{"role": "user", "content": _first_prompt(store, t)}],
             "ability": t.domain.split(".", 1)[0],
             "reward_model": {"style": "rule", "ground_truth": ground_truth(store, t)},
             "extra_info": {"index": i, "split": t.split, "trajectory_id": t.id, "task_key": t.task_key,
                            "task_hash": t.task_hash, "reward": t.reward, "passed": t.passed,
                            "status": t.status}}
            for i, t in enumerate(trajs)]


def _ids(t: Trajectory) -> dict[str, Any]:
    return {"trajectory_id": t.id, "domain": t.domain, "task_key": t.task_key,
            "reward": None if t.reward is None else float(t.reward), "passed": t.passed}


def trl_rows(trajs: list[Trajectory]) -> list[dict[str, Any]]:
    if any(len(t.turns) > 1 for t in trajs):
        rows = []
        for t in trajs:
            msgs = conversation(t)
            rows.append({"prompt": msgs[:1], "completion": msgs[1:], **_ids(t)})
        return rows
    return [{"prompt": t.turns[0].observation if t.turns else "",
             "completion": t.turns[0].action if t.turns else "", **_ids(t)} for t in trajs]


def sft_rows(trajs: list[Trajectory]) -> list[dict[str, Any]]:
    return [{"messages": conversation(t), **_ids(t)} for t in trajs]


def _schema(fmt: str, conversational: bool) -> Any:
    import pyarrow as pa

    msg = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))
    ids = [("trajectory_id", pa.string()), ("domain", pa.string()), ("task_key", pa.string()),
           ("reward", pa.float64()), ("passed", pa.bool_())]
    if fmt == "verl":
        return pa.schema([
            ("data_source", pa.string()), ("prompt", msg), ("ability", pa.string()),
            ("reward_model", pa.struct([("style", pa.string()), ("ground_truth", pa.string())])),
            ("extra_info", pa.struct([("index", pa.int64()), ("split", pa.string()),
                                      ("trajectory_id", pa.string()), ("task_key", pa.string()),
                                      ("task_hash", pa.string()), ("reward", pa.float64()),
                                      ("passed", pa.bool_()), ("status", pa.string())]))])
    if fmt == "trl":
        text = msg if conversational else pa.string()
        return pa.schema([("prompt", text), ("completion", text), *ids])
    return pa.schema([("messages", msg), *ids])


def export_for_trainer(store: Store, out: str | Path, fmt: str, *, run_id: str | None = None,
                       passed_only: bool = False, file_format: str | None = None) -> int:
    """Write `fmt` rows to `out` (Parquet, or JSON lines when `file_format` is 'jsonl' or the
    name ends in .jsonl); returns the number of rows."""
    if fmt not in FORMATS:
        raise ValueError(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    trajs = list(store.trajectories(run_id=run_id))
    if fmt != "verl":
        trajs = [t for t in trajs if t.trainable]
    if passed_only:
        trajs = [t for t in trajs if t.passed]
    if fmt == "verl":
        rows = verl_rows(store, trajs)
    elif fmt == "trl":
        rows = trl_rows(trajs)
    else:
        rows = sft_rows(trajs)
    conversational = fmt == "trl" and bool(rows) and isinstance(rows[0]["prompt"], list)
    kind = file_format or ("jsonl" if str(out).endswith(".jsonl") else "parquet")
    if kind == "jsonl":
        with open(out, "w", encoding="utf-8") as f:
            for r in rows:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows, schema=_schema(fmt, conversational)), str(out))
    return len(rows)
