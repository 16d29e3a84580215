"""Reading the rows of a data source: JSONL, JSON, Parquet, or a `datasets.save_to_disk` folder.

Each row comes with where it is (`qa.jsonl:18 (row 17)`, `qa.parquet: row 17`,
`ds (split 'train', row 17)`), so every later error can name the file and the row. Row numbers
count data rows from 0, as `datasets` does.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any


class RowsError(ValueError):
    """A data file that cannot be read as rows; the message names the file (and line)."""


Row = tuple[str, int, dict[str, Any]]
"""(where, row number, the row's columns)"""


def _jsonl(path: Path) -> Iterator[Row]:
    n = 0
    with path.open(encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise RowsError(f"{path}:{line_no}: invalid JSON: {e.msg} (column {e.colno})") from None
            if not isinstance(row, dict):
                raise RowsError(f"{path}:{line_no}: expected a JSON object per line, got "
                                f"{type(row).__name__}")
            yield f"{path}:{line_no} (row {n})", n, row
            n += 1


def _json(path: Path) -> Iterator[Row]:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise RowsError(f"{path}:{e.lineno}: invalid JSON: {e.msg} (column {e.colno})") from None
    if not isinstance(doc, list):
        raise RowsError(f"{path}: expected a JSON list of objects, got {type(doc).__name__}")
    for n, row in enumerate(doc):
        if not isinstance(row, dict):
            raise RowsError(f"{path}: row {n}: expected an object, got {type(row).__name__}")
        yield f"{path}: row {n}", n, row


def _parquet(path: Path) -> Iterator[Row]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as e:
        raise RowsError(f"{path}: not a readable Parquet file: {e}") from None
    for n, row in enumerate(table.to_pylist()):
        yield f"{path}: row {n}", n, row


def _dataset_dir(path: Path) -> Iterator[Row]:
    try:
        import datasets
    except ImportError:
        raise RowsError(f"{path}: reading a `datasets` folder needs the `datasets` package "
                        "(pip install datasets)") from None
    try:
        loaded = datasets.load_from_disk(str(path))
    except (FileNotFoundError, ValueError) as e:
        raise RowsError(f"{path}: not a folder written by `datasets` save_to_disk: {e}") from None
    # A DatasetDict's splits are pooled, in name order: posttrain splits by content (see data.py)
    parts = sorted(loaded.items()) if isinstance(loaded, datasets.DatasetDict) else [(None, loaded)]
    n = 0
    for split, ds in parts:
        for i, row in enumerate(ds):
            where = f"{path} (split {split!r}, row {i})" if split is not None else f"{path}: row {i}"
            yield where, n, dict(row)
            n += 1


SUFFIXES = {".jsonl": _jsonl, ".json": _json, ".parquet": _parquet}


def read_rows(path: Path) -> list[Row]:
    """Every row of `path` (a file by its suffix, or a `save_to_disk` folder)."""
    if path.is_dir():
        return list(_dataset_dir(path))
    if not path.exists():
        raise RowsError(f"{path}: no such file or folder")
    reader = SUFFIXES.get(path.suffix.lower())
    if reader is None:
        raise RowsError(f"{path}: unknown data file type {path.suffix!r}; expected "
                        f"{', '.join(SUFFIXES)} or a `datasets` save_to_disk folder")
    try:
        return list(reader(path))
    except UnicodeDecodeError as e:
        raise RowsError(f"{path}: not UTF-8 text: {e}") from None
