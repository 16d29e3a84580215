"""What a data source says: which columns are the prompt and the answer, the split, the verifier.

It is a small TOML file beside the data (`qa.jsonl` -> `qa.toml`; a `save_to_disk` folder ->
`FOLDER/posttrain.toml`), or the source itself (`data:qa-source.toml`, whose `path` names the
data, relative to the TOML), and any field can also be given in the source string as a query
(`data:qa.jsonl?answer=solution&verifier=numeric&verifier.rel_tol=0.01`), which wins over the
file. Without any of it the defaults fit a file of `question`/`answer` pairs checked exactly.

    name = "qa"                  # the domain is data.qa (default: the file's name)
    prompt = "question"          # the prompt column (default: prompt, question, problem or input)
    template = "Q: {question}\\nA:" # or: the prompt built from columns (Python str.format)
    answer = "answer"            # the answer column (default: answer, solution, output or target)
    id = "id"                    # a column of stable row ids for task keys (default: row number)
    eval_fraction = 0.1          # rows whose prompt hashes below this share go to the eval split
    split_column = "split"       # or: take the split from a column (train; eval/test/validation)
    multiline = false            # answers span lines (default: the verifier's, e.g. code, JSON)
    max_tokens = 64              # new tokens per answer
    [verifier]
    name = "numeric"             # exact, normalized, numeric, regex, math, json, unit-tests, script
    rel_tol = 0.01               # the verifier's parameters (posttrain.verifiers.named)
    [verifier.columns]
    test = "tests"               # per-row parameters, from a column
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

from pydantic import BaseModel, ConfigDict, Field, ValidationError

SIDECAR_IN_FOLDER = "posttrain.toml"
PROMPT_COLUMNS = ("prompt", "question", "problem", "input")
ANSWER_COLUMNS = ("answer", "solution", "output", "target")


class SpecError(ValueError):
    """A data source description that cannot be used; names the file and the field."""


class DataSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str = Field(description="the data: .jsonl, .json, .parquet or a save_to_disk folder")
    name: str | None = Field(None, pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$",
                             description="domain name after 'data.' (default: the file's stem)")
    prompt: str | None = Field(None, description="prompt column")
    template: str | None = Field(None, description="prompt built from columns with str.format")
    answer: str | None = Field(None, description="answer column (the oracle)")
    id: str | None = Field(None, description="column of stable row ids")
    eval_fraction: float = Field(0.1, ge=0, le=1, description="share of rows in the eval split, by "
                                                              "content hash of the prompt")
    split_column: str | None = Field(None, description="take the split from this column instead")
    multiline: bool | None = Field(None, description="answers span lines (default: the verifier's)")
    max_tokens: int | None = Field(None, ge=1, description="new tokens per answer")
    verifier: dict[str, Any] = Field(default_factory=lambda: {"name": "exact"},
                                     description="name, parameters, and columns = {param: column}")


def _value(text: str) -> Any:
    """A query value as TOML would read it (numbers, booleans), else the text itself."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


_STRING_FIELDS = {"path", "name", "prompt", "template", "answer", "id", "split_column"}


def _query(query: str, where: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, text in parse_qsl(query, keep_blank_values=True, strict_parsing=False):
        parts = key.split(".")
        if parts[0] == "verifier":
            node = out.setdefault("verifier", {})
            if len(parts) == 1:
                node["name"] = text
            elif len(parts) == 2:
                node[parts[1]] = _value(text)
            elif len(parts) == 3 and parts[1] == "columns":
                node.setdefault("columns", {})[parts[2]] = text
            else:
                raise SpecError(f"{where}: query field {key!r}: expected verifier, verifier.PARAM "
                                "or verifier.columns.PARAM")
        elif len(parts) == 1:
            out[key] = text if key in _STRING_FIELDS else _value(text)
        else:
            raise SpecError(f"{where}: unknown query field {key!r}")
    return out


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise SpecError(f"{path}: not valid TOML: {e}") from None
    except OSError as e:
        raise SpecError(f"{path}: cannot read: {e.strerror or e}") from None


def parse_data_source(text: str, base: Path | None = None) -> tuple[DataSpec, Path, str]:
    """`PATH[?QUERY]` (after 'data:') -> (spec, the data's resolved path, where the spec came from).

    Relative paths resolve against `base` (default: the current directory)."""
    path_text, _, query = text.partition("?")
    if not path_text:
        raise SpecError(f"data:{text}: no path given (data:PATH, e.g. data:qa.jsonl)")
    given = Path(path_text).expanduser()
    given = given if given.is_absolute() or base is None else base / given
    fields: dict[str, Any] = {}
    where = f"data:{text}"
    if given.suffix.lower() == ".toml":
        if not given.is_file():
            raise SpecError(f"{given}: no such data source file")
        fields = _read_toml(given)
        where = str(given)
        if "path" not in fields:
            raise SpecError(f"{given}: path: required (the data file, relative to this file)")
        data = Path(str(fields["path"])).expanduser()
        data = data if data.is_absolute() else given.parent / data
    else:
        data = given
        sidecar = data / SIDECAR_IN_FOLDER if data.is_dir() else data.with_suffix(".toml")
        if sidecar.is_file():
            fields = _read_toml(sidecar)
            where = str(sidecar)
            if "path" in fields:
                raise SpecError(f"{sidecar}: path: not allowed beside the data (it describes "
                                f"{data.name}); use it only in a source given as data:FILE.toml")
        fields["path"] = str(data)
    override = _query(query, where)
    if override:
        fields = {**fields, **{k: v for k, v in override.items() if k != "verifier"}}
        if "verifier" in override:
            merged = dict(fields.get("verifier") or {})
            columns = {**(merged.get("columns") or {}), **override["verifier"].pop("columns", {})}
            merged.update(override["verifier"])
            if columns:
                merged["columns"] = columns
            fields["verifier"] = merged
        where = f"{where} (with the query {query!r})" if where != f"data:{text}" else where
    fields["path"] = str(data)
    try:
        spec = DataSpec.model_validate(fields)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
        msg = "unknown field" if err["type"] == "extra_forbidden" else err["msg"]
        raise SpecError(f"{where}: {loc}: {msg}" + (f" (got {err['input']!r:.60})"
                                                    if err["type"] != "extra_forbidden" else "")) from None
    return spec, data.resolve(), where
