"""Task sets: what `--tasks SET` means, and frozen task-set files.

`--tasks` is one of:

* domain globs, comma-separated (`'math.*,text.sort.*'`): the eval split of every matching
  domain, seeds 0..N-1 (`EvalConfig.tasks_per_domain`); a problem a small domain repeats is kept
  once (tasks are identified by content hash);
* a frozen task-set file (`{"format": "posttrain.taskset/1", "name", "tasks": [Task, ...]}`), as
  written by `save_task_set` -- a baseline file (`posttrain.baseline/1`) works too;
* a task file (`.toml`, `.jsonl` or `.json`, see `posttrain.tasks.files`): one Task or many.

Tasks from files are used exactly as written (their hash is checked against nothing: the file is
the definition); their domain must be registered, since the domain supplies the environment and
the verifier.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from posttrain.tasks.domain import Domain, NoTasksInSplit
from posttrain.tasks.registry import RegistryError, get_domain, match_domains
from posttrain.values.task import Split, Task

if TYPE_CHECKING:
    from posttrain.storage.store import Store

TASKSET_FORMAT = "posttrain.taskset/1"

TaskList = list[tuple[Domain, Task]]


class TaskSetError(ValueError):
    """A task set that cannot be resolved; the message names the file, line or pattern."""


def _dedupe(tasks: TaskList) -> TaskList:
    seen: set[str] = set()
    out = []
    for d, t in tasks:
        if t.hash not in seen:
            seen.add(t.hash)
            out.append((d, t))
    return out


def tasks_from_domains(patterns: str | Sequence[str], per_domain: int, split: Split = "eval",
                       first_seed: int = 0) -> TaskList:
    try:
        domains = match_domains(patterns)
    except RegistryError as e:
        raise TaskSetError(str(e)) from None
    out = []
    for d in domains:
        try:
            out += [(d, d.task(seed, split)) for seed in range(first_seed, first_seed + per_domain)]
        except NoTasksInSplit:
            continue  # an imported single task that lives in the other split
    return _dedupe(out)


def parse_task(obj: Any, where: str) -> tuple[Domain, Task]:
    if not isinstance(obj, dict):
        raise TaskSetError(f"{where}: expected a Task object, got {type(obj).__name__}")
    try:
        task = Task.model_validate(obj)
    except ValidationError as e:
        first = e.errors()[0]
        loc = ".".join(str(x) for x in first["loc"])
        raise TaskSetError(f"{where}: invalid task, field {loc!r}: {first['msg']}") from None
    try:
        return get_domain(task.domain), task
    except RegistryError as e:
        raise TaskSetError(f"{where}: {e}") from None


def load_task_file(path: str | Path) -> TaskList:
    """Tasks from a frozen task-set or baseline file, else from a task file (`.toml`, `.jsonl`,
    `.json`) read by the one task-file loader, `posttrain.tasks.files` (errors name the file,
    the line or table, and the field)."""
    from posttrain.tasks.files import TaskFileError
    from posttrain.tasks.files import load_task_file as load_tasks

    path = Path(path)
    if path.suffix.lower() == ".json":
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            data = None  # the task-file loader reports it, naming the line
        if isinstance(data, dict) and "format" in data:
            if data["format"] not in (TASKSET_FORMAT, "posttrain.baseline/1"):
                raise TaskSetError(f"{path}: field 'format' is {data['format']!r}; expected "
                                   f"{TASKSET_FORMAT!r} or 'posttrain.baseline/1'")
            items = data.get("tasks")
            if not isinstance(items, list) or not items:
                raise TaskSetError(f"{path}: field 'tasks' must be a non-empty list of tasks")
            return _dedupe([parse_task(obj, f"{path}: tasks[{i}]") for i, obj in enumerate(items)])
    try:
        tasks = load_tasks(path, require_known_domain=True)
    except TaskFileError as e:
        raise TaskSetError(str(e)) from None
    return _dedupe([(get_domain(t.domain), t) for t in tasks])


def is_task_file(spec: str | Path) -> bool:
    """Whether `spec` names an existing file. A long list of domain names is no file name: the
    operating system refuses it (ENAMETOOLONG) rather than saying "no such file", so any OSError
    here means "not a file" and the spec is read as domain globs."""
    try:
        return Path(spec).is_file()
    except OSError:
        return False


def resolve_tasks(spec: str, per_domain: int = 20) -> TaskList:
    """`--tasks SET` -> (domain, task) pairs (see the module docstring)."""
    if not spec or not spec.strip():
        raise TaskSetError("--tasks is empty: give domain globs (e.g. 'math.*') or a task-set file")
    path = Path(spec)
    if is_task_file(path):
        return load_task_file(path)
    if path.suffix in (".json", ".jsonl", ".toml") or "/" in spec:
        raise TaskSetError(f"{spec}: no such task-set file (and not a domain glob)")
    return tasks_from_domains(spec, per_domain)


def save_task_set(path: str | Path, tasks: TaskList, name: str = "",
                  meta: dict[str, Any] | None = None) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {"format": TASKSET_FORMAT, "name": name or path.stem, "meta": meta or {},
            "tasks": [t.model_dump(mode="json") for _, t in tasks]}
    path.write_text(json.dumps(body, indent=1))
    return path


def stratified(tasks: TaskList, size: int) -> TaskList:
    """`size` tasks spread evenly over domains (round-robin in each domain's order)."""
    by_domain: dict[str, TaskList] = {}
    for d, t in tasks:
        by_domain.setdefault(d.name, []).append((d, t))
    out: TaskList = []
    queues = [list(v) for _, v in sorted(by_domain.items())]
    while len(out) < size and any(queues):
        for q in queues:
            if q and len(out) < size:
                out.append(q.pop(0))
    return out


def tasks_of_records(records: Sequence[Any], store: Store | None = None) -> TaskList:
    """The tasks an eval result was run on, rebuilt from its records: regenerated from
    (domain, seed, split) and checked against the recorded hash, else read from `store` by hash."""
    out: TaskList = []
    for r in records:
        try:
            domain = get_domain(r.domain)
        except RegistryError as e:
            raise TaskSetError(f"task {r.key}: {e}") from None
        task = None
        if r.seed is not None:
            candidate = domain.task(r.seed, r.split)
            if candidate.hash == r.hash:
                task = candidate
        if task is None and store is not None:
            try:
                task = store.get_task(r.hash)
            except KeyError:
                task = None
        if task is None:
            raise TaskSetError(f"task {r.key} ({r.hash[:12]}) cannot be rebuilt: its generator now "
                               "makes a different task and no run store holding it was given")
        out.append((domain, task))
    return out
