"""A data file as a domain, with no code: `data:PATH` -> `Domain` named `data.<name>`.

Every row becomes one single-answer task: the prompt column (or the template) is what the policy
sees, the answer column is the hidden reference and the oracle, the named verifier grades it
(`posttrain.verifiers.named`). Such a domain is checked like any other (`posttrain tasks check`:
the oracle passes, generated negatives fail: the empty answer, a perturbed answer, another row's
answer), and goes through the same contamination check before training.

The split is by content: a row is in the eval split when the hash of its prompt (NFKC,
whitespace collapsed, letter case kept: what the contamination check calls the same problem)
falls below `eval_fraction`, so the same question asked twice is always in one split and train and
eval never share a prompt, however the file is ordered or grows. `split_column` takes the split
from the data instead (then the contamination check is what guards the overlap).

`generate(seed, split)` takes row `seed mod N` of the split (N rows), with `Task.seed` that row's
index in the split, so the scheduler's arbitrary seeds walk the rows and equal rows are equal
tasks. Task keys are `data.<name>/<split>/<row id>` (the id column's value, else `row<N>`, the row
number in the file), so a failure points at its row. Errors name the file, the row and the column.
"""

from __future__ import annotations

import hashlib
import unicodedata
from pathlib import Path
from typing import Any

from posttrain.tasks.domain import Domain, NoTasksInSplit
from posttrain.tasks.sources.rows import read_rows
from posttrain.tasks.sources.spec import ANSWER_COLUMNS, PROMPT_COLUMNS, DataSpec
from posttrain.values.task import Split, Task, TaskLimits
from posttrain.verifiers.answer import default_rel_tol, parse_number, within_tolerance
from posttrain.verifiers.named import NamedVerifier, named_verifier, normalize_text

MAX_REPORTED_ERRORS = 20
FAMILY = "data"
EVAL_NAMES = ("eval", "test", "validation", "valid", "dev")


class DataSourceError(ValueError):
    """Rows that cannot become tasks; lists every problem (file, row, column) up to a limit."""


def split_of(prompt: str, eval_fraction: float) -> Split:
    """The split of a prompt, by the hash of its normalised text (see the module docstring)."""
    text = " ".join(unicodedata.normalize("NFKC", prompt).split())
    bucket = int(hashlib.sha256(text.encode("utf-8")).hexdigest()[:12], 16) / 16 ** 12
    return "eval" if bucket < eval_fraction else "train"


def _pick(columns: set[str], given: str | None, defaults: tuple[str, ...], what: str, where: str) -> str:
    if given:
        if given not in columns:
            raise DataSourceError(f"{where}: {what} column {given!r} is not in the data (columns: "
                                  f"{', '.join(sorted(columns))})")
        return given
    for c in defaults:
        if c in columns:
            return c
    raise DataSourceError(f"{where}: no {what} column: name it ({what} = \"COLUMN\"); the data has "
                          f"{', '.join(sorted(columns))} and none of the default names "
                          f"{', '.join(defaults)}")


class _Builder:
    """Turns rows into tasks, collecting every problem instead of stopping at the first."""

    def __init__(self, spec: DataSpec, name: str, nv: NamedVerifier, where: str) -> None:
        self.spec, self.name, self.nv, self.where = spec, name, nv, where
        vs = dict(spec.verifier)
        vs.pop("name", None)
        self.columns: dict[str, str] = dict(vs.pop("columns", None) or {})
        self.params = nv.settings(vs, where)  # ValueError names the parameter
        for param in self.columns:
            if param not in nv.params:
                raise DataSourceError(f"{where}: verifier.columns.{param}: unknown parameter of the "
                                      f"{nv.verifier.name!r} verifier (known: {', '.join(sorted(nv.params))})")
        missing = [p for p in nv.required if p not in self.params and p not in self.columns]
        if missing:
            raise DataSourceError(f"{where}: verifier.{missing[0]}: the {nv.verifier.name!r} verifier "
                                  f"needs it (a parameter, or a column: verifier.columns.{missing[0]})")
        self.multiline = nv.multiline if spec.multiline is None else spec.multiline
        self.limits = TaskLimits(max_tokens=spec.max_tokens) if spec.max_tokens else TaskLimits()
        self.errors: list[str] = []

    def task(self, where: str, n: int, row: dict[str, Any], prompt_col: str | None,
             answer_col: str) -> tuple[Split, Task] | None:
        spec, errors = self.spec, self.errors
        before = len(errors)
        if spec.template is not None:
            try:
                prompt = spec.template.format_map(row)
            except KeyError as e:
                errors.append(f"{where}: template: column {e.args[0]!r} is not in this row")
                return None
            except (ValueError, IndexError, AttributeError) as e:
                errors.append(f"{where}: template: {e}")
                return None
        else:
            prompt = row.get(prompt_col) if prompt_col is not None else None  # type: ignore[assignment]
            if isinstance(prompt, (int, float)) and not isinstance(prompt, bool):
                prompt = str(prompt)
            if not isinstance(prompt, str) or not prompt.strip():
                errors.append(f"{where}: column {prompt_col!r}: expected a non-empty prompt string, "
                              f"got {prompt!r:.60}")
        value = row.get(answer_col)
        reference: Any = None
        if value is None:
            errors.append(f"{where}: column {answer_col!r}: missing (every row needs its answer)")
        else:
            try:
                reference = self.nv.reference(value)
            except ValueError as e:
                errors.append(f"{where}: column {answer_col!r}: {e} (verifier {self.nv.verifier.name})")
        settings = dict(self.params)
        for param, col in self.columns.items():
            if row.get(col) is None:
                errors.append(f"{where}: column {col!r} (verifier.{param}): missing")
                continue
            try:
                settings.update(self.nv.settings({param: row[col]}, where))
            except ValueError as e:
                errors.append(f"{e} (column {col!r})")
        if self.nv.answer_in_args and reference is not None:
            settings["args"] = {**(settings.get("args") or {}), "expected": reference}
        if reference is not None and not self.multiline and "\n" in self.nv.oracle(reference).strip():
            errors.append(f"{where}: column {answer_col!r}: the answer spans several lines, but "
                          "completions end at a newline; set multiline = true")
        rid = row.get(spec.id) if spec.id else f"row{n}"
        if spec.id and (rid is None or isinstance(rid, (dict, list))):
            errors.append(f"{where}: column {spec.id!r}: expected a row id, got {rid!r:.60}")
        if len(errors) > before:
            return None
        split: Split
        if spec.split_column:
            label = str(row.get(spec.split_column, "")).strip().lower()
            if label != "train" and label not in EVAL_NAMES:
                errors.append(f"{where}: column {spec.split_column!r}: expected train or one of "
                              f"{', '.join(EVAL_NAMES)}, got {row.get(spec.split_column)!r:.40}")
                return None
            split = "train" if label == "train" else "eval"
        else:
            split = split_of(prompt, spec.eval_fraction)
        try:
            task = Task(domain=self.name, prompt=prompt, reference={"answer": reference},
                        verifier=settings, env="single", split=split, limits=self.limits,
                        tags=(FAMILY,), key=f"{self.name}/{split}/{rid}")
        except ValueError as e:
            errors.append(f"{where}: {e}")
            return None
        return split, task


def _distinct(nv: NamedVerifier, a: Any, b: Any, settings: dict[str, Any]) -> bool:
    """Whether another row's answer is surely wrong here (used as a negative)."""
    if nv.verifier.name == "numeric":
        x, y = parse_number(str(a)), parse_number(str(b))
        return not within_tolerance(y, x, 10 * float(settings.get("rel_tol", default_rel_tol(a))),
                                    10 * float(settings.get("abs_tol", 1e-9)))
    return normalize_text(str(a)) != normalize_text(str(b))


def data_domain(spec: DataSpec, data: Path, where: str) -> Domain:
    """Read `data` and build its domain; raises DataSourceError listing every bad row."""
    rows = read_rows(data)
    if not rows:
        raise DataSourceError(f"{data}: no rows")
    name = f"{FAMILY}.{spec.name or _stem(data)}"
    nv = named_verifier(str(spec.verifier.get("name", "exact")), where)
    builder = _Builder(spec, name, nv, where)
    columns = set().union(*(r.keys() for _, _, r in rows[:100]))
    prompt_col = None if spec.template else _pick(columns, spec.prompt, PROMPT_COLUMNS, "prompt", where)
    answer_col = _pick(columns, spec.answer, ANSWER_COLUMNS, "answer", where)
    by_split: dict[str, list[Task]] = {"train": [], "eval": []}
    keys: dict[str, str] = {}
    for row_where, n, row in rows:
        built = builder.task(row_where, n, row, prompt_col, answer_col)
        if built is None:
            continue
        split, task = built
        if task.key in keys:
            builder.errors.append(f"{row_where}: column {spec.id!r}: id {task.key.rsplit('/', 1)[1]!r} "
                                  f"is already used at {keys[task.key]}")
            continue
        keys[task.key] = row_where
        by_split[split].append(task)
    if builder.errors:
        errors = builder.errors
        more = len(errors) - MAX_REPORTED_ERRORS
        raise DataSourceError("\n".join(errors[:MAX_REPORTED_ERRORS] + ([f"... and {more} more"] if more > 0 else [])))
    tables = {s: [t.model_copy(update={"seed": i}) for i, t in enumerate(ts)] for s, ts in by_split.items()}

    def generate(seed: int, split: Split) -> Task:
        if split not in tables:
            raise ValueError(f"domain {name}: split must be 'train' or 'eval', got {split!r}")
        table = tables[split]
        if not table:
            raise NoTasksInSplit(f"domain {name} has no {split}-split rows (eval_fraction "
                                 f"{spec.eval_fraction}, {where})")
        return table[seed % len(table)]

    def oracle(task: Task) -> list[str]:
        return [nv.oracle(task.reference["answer"])]

    def negatives(task: Task) -> dict[str, list[str]]:
        ref = task.reference["answer"]
        out = {"empty": [""], "wrong": [nv.wrong(ref, task.verifier)]}
        if nv.verifier.name in ("exact", "normalized", "numeric"):
            table = tables[task.split]
            for k in range(1, min(len(table), 50)):  # the next row whose answer surely differs
                other = table[(int(task.seed or 0) + k) % len(table)].reference["answer"]
                if _distinct(nv, ref, other, task.verifier):
                    out["other_row"] = [nv.oracle(other)]
                    break
        return out

    return Domain(name=name, family=FAMILY, env="single", verifier=nv.verifier, generate=generate,
                  oracle=oracle, negatives=negatives, stop=() if builder.multiline else None,
                  description=f"{data.name}: {len(tables['train'])} train / {len(tables['eval'])} "
                              f"eval rows, verifier {nv.verifier.name}",
                  tags=(FAMILY,))


def _stem(path: Path) -> str:
    import re

    stem = path.name if path.is_dir() else path.stem
    return re.sub(r"[^A-Za-z0-9_-]+", "-", stem).strip("-") or "data"
