"""Structured (JSON) answers: parse, validate against a JSON Schema, compare values within a
tolerance, then check consistency rules on the submitted figures.

`task.reference["answer"]` is the expected JSON value. `task.verifier` holds:

* `schema`: a JSON Schema (draft 2020-12) the answer must satisfy (`jsonschema` library);
* `tolerance`: `{"rel": r, "abs": a}` for every number (default exact: `{"rel": 0, "abs": 0}`);
  a number passes iff `|got - want| <= max(a, r * |want|)`;
* `field_tolerance`: per-field overrides, keyed by the field's path ("growth_pct",
  "revenue_by_year/2023") or by its last key;
* `consistency`: rules the submitted numbers must satisfy among themselves, e.g. totals add up
  or assets = liabilities + equity. Each rule is a dict:
  - `{"kind": "linear", "name": ..., "total": PATH, "terms": {PATH: coef, ...}, "abs_tol": t}`:
    `total == sum(coef * value)` within `t` (default 0.5, i.e. exact for integers);
  - `{"kind": "ratio", "name": ..., "result": PATH, "num": {PATH: coef}, "den": {PATH: coef},
    "scale": s, "abs_tol": t}`: `result == s * num / den` within `t` (default 0.006: a value
    rounded to 2 decimals).

Stages run in that order and the first failing one is reported in `details["stage"]`
(`parse`, `schema`, `values`, `consistency`). Strings compare after stripping, case-insensitively.

Parsing: the whole answer (stripped) must be one JSON value; one surrounding Markdown code fence
(```json ... ```) is removed first, nothing else is extracted. NaN/Infinity, numbers beyond float
range, integers longer than 300 digits, answers over `MAX_ANSWER_CHARS` and nesting deeper than
Python's parser allows are malformed answers (a failed verdict), never exceptions. A schema or
rule that is itself invalid is a `VerifierError`.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import jsonschema

from posttrain.values.verdict import Verdict
from posttrain.verifiers.base import Outcome, VerifierError, verdict

MAX_ANSWER_CHARS = 100_000
"""longer answers are refused before parsing"""

MAX_INT_DIGITS = 300
"""integers with more digits are refused (they cannot be compared as floats)"""

_FENCE = re.compile(r"\A```[a-zA-Z]*[ \t]*\n(.*?)\n?```\Z", re.DOTALL)


class _Malformed(ValueError):
    pass


def _reject_constant(name: str) -> Any:
    raise _Malformed(f"{name} is not allowed")


def _check_numbers(value: Any, path: str = "") -> None:
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return
    if isinstance(value, int):
        if len(str(abs(value))) > MAX_INT_DIGITS:
            raise _Malformed(f"integer at '{path or '/'}' has more than {MAX_INT_DIGITS} digits")
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise _Malformed(f"number at '{path or '/'}' is out of range")
    elif isinstance(value, dict):
        for k, v in value.items():
            _check_numbers(v, f"{path}/{k}" if path else k)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check_numbers(v, f"{path}/{i}" if path else str(i))


def parse_json_answer(text: str) -> Any:
    """The JSON value of an answer; raises ValueError saying why it is malformed."""
    s = text.strip()
    if not s:
        raise _Malformed("empty answer")
    if len(s) > MAX_ANSWER_CHARS:
        raise _Malformed(f"answer longer than {MAX_ANSWER_CHARS} characters")
    fenced = _FENCE.match(s)
    if fenced:
        s = fenced.group(1).strip()
    try:
        value = json.loads(s, parse_constant=_reject_constant)
    except _Malformed:
        raise
    except json.JSONDecodeError as e:
        raise _Malformed(f"invalid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    except (ValueError, RecursionError) as e:  # int digit limit, nesting too deep
        raise _Malformed(f"invalid JSON: {type(e).__name__}: {str(e)[:100]}") from None
    _check_numbers(value)
    return value


@lru_cache(maxsize=256)
def _validator(schema_json: str) -> jsonschema.Draft202012Validator:
    schema = json.loads(schema_json)
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def get_path(value: Any, path: str) -> Any:
    """`value["a"]["b"]` for the path "a/b" (list items by index); KeyError if absent."""
    for part in path.split("/"):
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            raise KeyError(path)
    return value


@dataclass(frozen=True)
class StructuredAnswer:
    """JSON answer: schema, then values within tolerance, then consistency rules."""

    name: str = "json"
    version: str = "2"
    needs_sandbox: bool = False

    def verify(self, task, outcome: Outcome) -> Verdict:
        settings: Mapping[str, Any] = task.verifier
        ref = task.reference
        if not isinstance(ref, dict) or "answer" not in ref:
            raise VerifierError(f"task {task.key}: reference has no 'answer'")
        if outcome.answer is None:
            return verdict(self, False, stage="parse", reason="no answer")
        try:
            got = parse_json_answer(outcome.answer)
        except ValueError as e:
            return verdict(self, False, stage="parse", reason=str(e))

        schema = settings.get("schema")
        if schema is not None:
            try:
                validator = _validator(json.dumps(schema, sort_keys=True))
            except jsonschema.SchemaError as e:
                raise VerifierError(f"task {task.key}: invalid JSON Schema: {e.message}") from e
            error = jsonschema.exceptions.best_match(validator.iter_errors(got))
            if error is not None:
                where = "/".join(str(p) for p in error.absolute_path) or "/"
                return verdict(self, False, stage="schema", reason=f"at '{where}': {error.message[:300]}")

        mismatches = self._compare(ref["answer"], got, "", settings)
        if mismatches:
            return verdict(self, False, stage="values", reason="values differ", mismatches=mismatches[:20])

        broken = []
        for rule in settings.get("consistency", ()):
            ok, why = self._rule(rule, got, task.key)
            if not ok:
                broken.append(f"{rule.get('name', rule.get('kind'))}: {why}")
        if broken:
            return verdict(self, False, stage="consistency", reason="inconsistent figures", rules=broken)
        return verdict(self, True)

    # -- values --------------------------------------------------------------------------
    @staticmethod
    def _tolerance(settings: Mapping[str, Any], path: str) -> tuple[float, float]:
        per_field = settings.get("field_tolerance", {})
        tol = per_field.get(path) or per_field.get(path.rsplit("/", 1)[-1]) or settings.get("tolerance", {})
        return float(tol.get("rel", 0.0)), float(tol.get("abs", 0.0))

    def _compare(self, want: Any, got: Any, path: str, settings: Mapping[str, Any]) -> list[str]:
        where = path or "/"
        if isinstance(want, dict):
            if not isinstance(got, dict):
                return [f"{where}: expected an object"]
            out = []
            for k, v in want.items():
                sub = f"{path}/{k}" if path else str(k)
                out += self._compare(v, got[k], sub, settings) if k in got else [f"{sub}: missing"]
            return out
        if isinstance(want, list):
            if not isinstance(got, list) or len(got) != len(want):
                return [f"{where}: expected a list of {len(want)} items"]
            return [m for i, (w, g) in enumerate(zip(want, got)) for m in
                    self._compare(w, g, f"{path}/{i}" if path else str(i), settings)]
        if _is_number(want):
            if not _is_number(got):
                return [f"{where}: expected a number"]
            rel, abs_ = self._tolerance(settings, path)
            if abs(float(got) - float(want)) > max(abs_, rel * abs(float(want))):
                return [f"{where}: {got} is not within tolerance of the reference"]
            return []
        if isinstance(want, str):
            if not isinstance(got, str) or got.strip().casefold() != want.strip().casefold():
                return [f"{where}: wrong text"]
            return []
        # by type: True is not 1 (Python's == says it is)
        return [] if type(got) is type(want) and got == want else [f"{where}: expected {json.dumps(want)}"]

    # -- consistency ---------------------------------------------------------------------
    @staticmethod
    def _number(got: Any, path: str) -> float:
        value = get_path(got, path)
        if not _is_number(value):
            raise KeyError(path)
        return float(value)

    def _combo(self, terms: Mapping[str, float], got: Any) -> float:
        return sum(float(coef) * self._number(got, path) for path, coef in terms.items())

    def _rule(self, rule: Mapping[str, Any], got: Any, key: str) -> tuple[bool, str]:
        kind = rule.get("kind")
        needed = {"linear": ("total", "terms"), "ratio": ("result", "num", "den")}.get(str(kind))
        if needed is None:
            raise VerifierError(f"task {key}: unknown consistency rule kind {kind!r}")
        if any(k not in rule for k in needed):
            raise VerifierError(f"task {key}: consistency rule {dict(rule)} needs keys {needed}")
        try:
            if kind == "linear":
                total = self._number(got, rule["total"])
                expected = self._combo(rule["terms"], got)
                tol = float(rule.get("abs_tol", 0.5))
            else:
                total = self._number(got, rule["result"])
                den = self._combo(rule["den"], got)
                if den == 0:
                    return False, "denominator is zero"
                expected = float(rule.get("scale", 1.0)) * self._combo(rule["num"], got) / den
                tol = float(rule.get("abs_tol", 0.006))
        except KeyError as e:
            return False, f"field {e.args[0]!r} is missing or not a number"
        except (TypeError, ValueError) as e:
            raise VerifierError(f"task {key}: malformed consistency rule {dict(rule)}: {e}") from e
        if not math.isfinite(expected) or abs(total - expected) > tol:
            return False, f"{total} != {expected:.6g}"
        return True, ""


STRUCTURED = StructuredAnswer()
