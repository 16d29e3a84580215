"""Tasks written by hand: TOML and JSONL task files.

TOML, one task per file:

    domain = "math.add.d2"
    prompt = "37+48="
    reference = "85"

or many, as an array of tables; other top-level keys are defaults every task inherits:

    domain = "text.reverse.l3"
    [[tasks]]
    prompt = "reverse abc="
    reference = "cba"
    [[tasks]]
    prompt = "reverse xyz="
    reference = "zyx"

JSONL: one `Task` as a JSON object per line (blank lines and lines starting with `#` are
skipped). A `.json` file holds one task object or a list of them.

Fields are those of `posttrain.values.task.Task`, plus `files_from = "DIR"` (relative to the
task file): the workspace starts as a copy of that folder, exactly (`read_folder`: binary files,
modes with setuid/setgid bits, empty directories, symlinks that stay inside it; a path the task
also gives in `files` or `entries` is the task's). A task without a `key` gets
`<domain>/<split>/<first 12 hex digits of its content hash>`, stable when the file is
reordered. Every error names the file, the line (or the TOML table) and the field:
`tasks.jsonl:3: field 'prompt': Field required`. All errors of a file are reported at once.
"""

from __future__ import annotations

import json
import os
import re
import stat
import tomllib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from posttrain.values.task import FileEntry, Task, check_workspace_path

MAX_REPORTED_ERRORS = 20
"""a file with more errors reports the first ones and a count of the rest"""


class TaskFileError(ValueError):
    """A task file that cannot be read; the message lists every problem found."""


class _Invalid:
    """A line that could not even be parsed (reported with the others)."""

    def __init__(self, message: str) -> None:
        self.message = message


def _describe(e: ValidationError) -> list[str]:
    """Pydantic errors as "field 'limits.max_turns': Input should be ... (got 'x')"."""
    out = []
    for err in e.errors():
        loc = ".".join(str(p) for p in err["loc"])
        msg = err["msg"]
        if err["type"] not in ("missing",) and "input" in err and not isinstance(err["input"], dict):
            msg += f" (got {err['input']!r:.60})"
        out.append(f"field '{loc}': {msg}" if loc else msg)
    return out


MAX_FOLDER_BYTES = 16 << 20
"""a `files_from` folder larger than this is refused (it is stored with every task)"""


def read_folder(root: Path) -> tuple[dict[str, str], dict[str, FileEntry]]:
    """A folder as a task's initial workspace: (UTF-8 files of mode 0644 as text, every other
    entry exactly). Directories are entries when they are empty or not 0755 (the others are
    implied by their contents). A symlink must stay inside the folder; a fifo or device file is
    refused. Raises TaskFileError naming the path."""
    if not root.is_dir():
        raise TaskFileError(f"{root}: field 'files_from': not a directory")
    files: dict[str, str] = {}
    entries: dict[str, FileEntry] = {}
    total = 0
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(dirnames + filenames):
            path = Path(dirpath) / name
            rel = path.relative_to(root).as_posix()
            st = path.lstat()
            mode = stat.S_IMODE(st.st_mode)
            try:
                if stat.S_ISLNK(st.st_mode):
                    entries[rel] = FileEntry.symlink(os.readlink(path))
                    check_workspace_path(rel, entries[rel])
                elif stat.S_ISDIR(st.st_mode):
                    if mode != 0o755 or not any(path.iterdir()):
                        entries[rel] = FileEntry.directory(mode)
                elif stat.S_ISREG(st.st_mode):
                    total += st.st_size
                    if total > MAX_FOLDER_BYTES:
                        raise ValueError(f"more than {MAX_FOLDER_BYTES} bytes of files in {root}")
                    data = path.read_bytes()
                    try:
                        text = data.decode("utf-8") if mode == 0o644 else None
                    except UnicodeDecodeError:
                        text = None
                    if text is not None:
                        files[rel] = text
                    else:
                        entries[rel] = FileEntry.file(data, mode)
                else:
                    raise ValueError("not a file, directory or symbolic link")
            except (ValueError, OSError) as e:
                raise TaskFileError(f"{path}: field 'files_from': {e}") from None
    return files, entries


def _build(data: Any, where: str, require_known_domain: bool,
           base: Path = Path(".")) -> tuple[Task | None, list[str]]:
    if not isinstance(data, dict):
        return None, [f"{where}: expected a task object (a table / JSON object), got {type(data).__name__}"]
    if "files_from" in data:
        data = dict(data)
        folder = data.pop("files_from")
        if not isinstance(folder, str) or not folder:
            return None, [f"{where}: field 'files_from': expected a folder path, got {folder!r}"]
        try:
            files, entries = read_folder(base / folder)
        except TaskFileError as e:
            return None, [f"{where}: {e}"]
        given_files, given_entries = data.get("files") or {}, data.get("entries") or {}
        if isinstance(given_files, dict) and isinstance(given_entries, dict):
            mine = set(given_files) | set(given_entries)  # a path the task gives wins
            data["files"] = {**{k: v for k, v in files.items() if k not in mine}, **given_files}
            data["entries"] = {**{k: v for k, v in entries.items() if k not in mine}, **given_entries}
    try:
        task = Task.model_validate(data)
    except ValidationError as e:
        return None, [f"{where}: {m}" for m in _describe(e)]
    if require_known_domain:
        from posttrain.tasks.registry import RegistryError, get_domain

        try:
            get_domain(task.domain)
        except RegistryError as e:
            return None, [f"{where}: field 'domain': {e}"]
    if not data.get("key"):
        task = task.model_copy(update={"key": f"{task.domain}/{task.split}/{task.hash[:12]}"})
    return task, []


def _toml_items(path: Path, text: str) -> Iterable[tuple[str, Any]]:
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise TaskFileError(f"{path}: invalid TOML: {e}") from None
    if "tasks" not in doc:
        yield f"{path}:1", doc
        return
    tables = doc.pop("tasks")
    if not isinstance(tables, list):
        raise TaskFileError(f"{path}: 'tasks' must be an array of tables ([[tasks]]), "
                            f"got {type(tables).__name__}")
    # Line of each [[tasks]] header, so errors can point at the table.
    lines = [i + 1 for i, line in enumerate(text.splitlines()) if re.match(r"\s*\[\[\s*tasks\s*\]\]", line)]
    for i, table in enumerate(tables):
        line = lines[i] if i < len(lines) else None
        where = f"{path}:{line} (tasks[{i}])" if line else f"{path}: tasks[{i}]"
        yield where, {**doc, **table} if isinstance(table, dict) else table


def _jsonl_items(path: Path, text: str) -> Iterable[tuple[str, Any]]:
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            yield f"{path}:{n}", json.loads(line)
        except json.JSONDecodeError as e:
            yield f"{path}:{n}", _Invalid(f"invalid JSON: {e.msg} (column {e.colno})")


def _json_items(path: Path, text: str) -> Iterable[tuple[str, Any]]:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise TaskFileError(f"{path}:{e.lineno}: invalid JSON: {e.msg} (column {e.colno})") from None
    for i, item in enumerate(doc if isinstance(doc, list) else [doc]):
        yield (f"{path}: [{i}]" if isinstance(doc, list) else f"{path}"), item


READERS = {".toml": _toml_items, ".jsonl": _jsonl_items, ".json": _json_items}


def load_task_file(path: str | Path, *, require_known_domain: bool = False) -> list[Task]:
    """Every task in a `.toml`, `.jsonl` or `.json` file, in file order.

    `require_known_domain`: also fail on a task whose domain is not registered (a task needs its
    domain's verifier to be graded). Raises `TaskFileError` listing every problem in the file.
    """
    path = Path(path)
    reader = READERS.get(path.suffix.lower())
    if reader is None:
        raise TaskFileError(f"{path}: unknown task file type {path.suffix!r}; expected one of "
                            f"{', '.join(READERS)}")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise TaskFileError(f"{path}: cannot read: {e}") from None
    tasks: list[Task] = []
    errors: list[str] = []
    seen: dict[str, str] = {}
    for where, data in reader(path, text):
        if isinstance(data, _Invalid):
            errors.append(f"{where}: {data.message}")
            continue
        task, problems = _build(data, where, require_known_domain, path.parent)
        errors += problems
        if task is None:
            continue
        if task.key in seen:
            errors.append(f"{where}: field 'key': {task.key!r} is already used at {seen[task.key]}")
            continue
        seen[task.key] = where
        tasks.append(task)
    if not errors and not tasks:
        errors.append(f"{path}: no tasks found")
    if errors:
        more = len(errors) - MAX_REPORTED_ERRORS
        shown = errors[:MAX_REPORTED_ERRORS] + ([f"... and {more} more"] if more > 0 else [])
        raise TaskFileError("\n".join(shown))
    return tasks


def load_task_files(paths: Iterable[str | Path], **kwargs: Any) -> list[Task]:
    """Tasks of several files; keys must be unique across them too."""
    tasks: list[Task] = []
    where: dict[str, Path] = {}
    for p in paths:
        for task in load_task_file(p, **kwargs):
            if task.key in where:
                raise TaskFileError(f"{p}: task key {task.key!r} is already used in {where[task.key]}")
            where[task.key] = Path(p)
            tasks.append(task)
    return tasks
