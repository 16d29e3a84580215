"""Edge cases of the JSON answer verifier: parse, schema, values, consistency; infra errors."""

from __future__ import annotations

import json

import pytest

from posttrain.values.task import Task
from posttrain.verifiers.base import Outcome, VerifierError
from posttrain.verifiers.structured import STRUCTURED, parse_json_answer

SCHEMA = {"type": "object", "required": ["a", "b", "total"], "additionalProperties": False,
          "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}, "total": {"type": "integer"},
                         "name": {"type": "string"}}}
RULE = {"kind": "linear", "name": "total = a + b", "total": "total", "terms": {"a": 1, "b": 1}}


def _task(answer=None, **settings) -> Task:
    settings = {"schema": SCHEMA, "consistency": [RULE], **settings}
    return Task(domain="t.json", prompt="p", reference={"answer": answer or {"a": 1, "b": 2, "total": 3}},
                verifier=settings, seed=0)


def _v(task, text):
    return STRUCTURED.verify(task, Outcome(answer=text))


@pytest.mark.parametrize("text,why", [
    ("", "empty"), ("{", "invalid JSON"), ('{"a": NaN, "b": 2, "total": 3}', "NaN"),
    ('{"a": Infinity, "b": 2, "total": 3}', "Infinity"), ('{"a": 1e999, "b": 2, "total": 3}', "out of range"),
    ('{"a": ' + "9" * 400 + ', "b": 2, "total": 3}', "digits"), ('{"a": ' + "9" * 5000 + "}", "invalid JSON"),
    ("[" * 100_000 + "]" * 100_000, "answer longer"), ("[" * 50_000, "invalid JSON"),
    ('{"a": 1} trailing', "invalid JSON"), ("The answer is {\"a\": 1}", "invalid JSON"),
])
def test_malformed_answers_fail_at_parse_without_raising(text, why):
    result = _v(_task(), text)
    assert not result.passed and result.details["stage"] == "parse" and why in result.details["reason"]


def test_deep_nesting_is_malformed_not_a_crash():
    result = _v(_task(), "[" * 30_000 + "]" * 30_000)
    assert not result.passed and result.details["stage"] in ("parse", "schema")


def test_stages_in_order():
    task = _task()
    assert _v(task, '{"a": 1, "b": 2, "total": 3}').passed
    assert _v(task, '\n```json\n{"a": 1,\n "b": 2, "total": 3}\n```\n').passed
    assert _v(task, '{"a": 1, "b": 2}').details["stage"] == "schema"
    assert _v(task, '{"a": "1", "b": 2, "total": 3}').details["stage"] == "schema"
    assert _v(task, '{"a": 1, "b": 2, "total": 3, "x": 0}').details["stage"] == "schema"
    wrong = _v(task, '{"a": 1, "b": 3, "total": 4}')
    assert wrong.details["stage"] == "values"
    assert wrong.details["mismatches"] == ["b: 3 is not within tolerance of the reference",
                                           "total: 4 is not within tolerance of the reference"]
    # a loose tolerance lets each figure pass on its own; consistency still catches the sum
    loose = _task(tolerance={"rel": 0.5, "abs": 0})
    assert _v(loose, '{"a": 1, "b": 2, "total": 4}').details["stage"] == "consistency"
    assert _v(loose, '{"a": 1, "b": 3, "total": 4}').passed


def test_field_tolerance_ratio_rules_and_nested_paths():
    answer = {"x": {"2021": 10, "2022": 30}, "growth_pct": 200.0}
    settings = {"schema": {"type": "object"}, "field_tolerance": {"growth_pct": {"abs": 0.006}},
                "consistency": [{"kind": "ratio", "result": "growth_pct", "num": {"x/2022": 1, "x/2021": -1},
                                 "den": {"x/2021": 1}, "scale": 100}]}
    task = Task(domain="t.json", prompt="p", reference={"answer": answer}, verifier=settings, seed=0)
    assert _v(task, json.dumps({"x": {"2021": 10, "2022": 30}, "growth_pct": 200.004})).passed
    assert not _v(task, json.dumps({"x": {"2021": 10, "2022": 30}, "growth_pct": 200.01})).passed
    zero = _v(task, json.dumps({"x": {"2021": 0, "2022": 30}, "growth_pct": 200.0}))
    assert not zero.passed


def test_strings_unicode_and_whitespace():
    answer = {"a": 1, "b": 2, "total": 3, "name": "Café Größe"}
    task = _task(answer)
    assert _v(task, json.dumps({**answer, "name": "  café GRÖSSE "})).passed  # casefold: ß == ss
    assert not _v(task, json.dumps({**answer, "name": "Cafe Grosse"})).passed
    assert _v(task, json.dumps(answer, ensure_ascii=False)).passed


def test_bad_settings_are_infra_errors():
    with pytest.raises(VerifierError, match="invalid JSON Schema"):
        _v(_task(schema={"type": "nonsense"}), '{"a": 1, "b": 2, "total": 3}')
    with pytest.raises(VerifierError, match="unknown consistency rule"):
        _v(_task(consistency=[{"kind": "magic"}]), '{"a": 1, "b": 2, "total": 3}')
    with pytest.raises(VerifierError, match="needs keys"):
        _v(_task(consistency=[{"kind": "linear", "total": "total"}]), '{"a": 1, "b": 2, "total": 3}')
    bad_ref = Task(domain="t.json", prompt="p", reference="3", seed=0)
    with pytest.raises(VerifierError, match="no 'answer'"):
        _v(bad_ref, "3")


def test_parse_json_answer_values():
    assert parse_json_answer(' {"a": [1, 2.5, null, true]} ') == {"a": [1, 2.5, None, True]}
    assert parse_json_answer("```\n[1]\n```") == [1]
    with pytest.raises(ValueError):
        parse_json_answer("-Infinity")
