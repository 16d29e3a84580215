"""Verifiers by name with parameters (`posttrain.verifiers.named`), as data sources use them."""

import json
import time
from pathlib import Path

import pytest

from posttrain.scheduling.domain_check import check_domains
from posttrain.tasks.sources import load_source
from posttrain.values.task import Task
from posttrain.verifiers.base import Outcome
from posttrain.verifiers.named import VERIFIERS, normalize_text


def grade(name, reference, answer, **settings):
    nv = VERIFIERS[name]
    task = Task(domain="data.t", prompt="p", reference={"answer": nv.reference(reference)},
                verifier=nv.settings(settings, "test"))
    return nv.verifier.verify(task, Outcome(answer=answer))


def test_normalized_text():
    assert normalize_text("  The  Eiffel-Tower! ") == "the eiffel tower"
    assert grade("normalized", "Eiffel Tower", "the eiffel tower.", drop_articles=True).passed
    assert not grade("normalized", "Eiffel Tower", "the eiffel tower.").passed
    assert not grade("normalized", "Paris", "London").passed
    assert not grade("normalized", "Paris", "").passed


def test_normalized_text_keeps_what_makes_a_number():
    """Signs, decimal points and separators inside numbers are not punctuation to drop."""
    for right, wrong in (("-3", "3"), ("3", "-3"), ("1.5", "1 5"), ("3.5", "3,5"), ("1/2", "1-2")):
        assert not grade("normalized", right, wrong).passed, (right, wrong)
        assert grade("normalized", right, f" {right}. ").passed
    assert grade("normalized", "COVID-19", "covid 19").passed  # a hyphen between word and number
    assert grade("normalized", "A", "(A)").passed


def test_numeric_compares_integers_exactly_unless_told_otherwise():
    assert not grade("numeric", "12345678", "12345679").passed
    assert not grade("numeric", "2500000", "2500002").passed
    assert grade("numeric", "12345678", "12,345,678").passed
    assert grade("numeric", "2.5", "2.5000001").passed  # decimals keep the 1e-6 default
    assert grade("numeric", "12345678", "12345679", rel_tol=1e-6).passed


def test_math_reads_an_answer_once_and_a_relation_is_no_value():
    """A hedge passes at most one reference; an inequality is not its right-hand side."""
    for gold, answer in (("3", r"x \neq 3"), ("3", "x > 3"), ("3", "x != 3"), ("3", "2 < 3"),
                         ("-3", r"x \neq -3"), ("3", r"x=4 \text{ and } x \ne 3"), ("2", r"\{1, 2\}"),
                         ("3", r"\pm 3"), ("3", r"\text{not } 3")):
        assert not grade("math", gold, answer).passed, (gold, answer)
    for hedge in (r"3 \text{ (or 4)}", r"4 \(3\)", "3 4"):
        assert sum(grade("math", gold, hedge).passed for gold in ("3", "4", "7")) <= 1, hedge
    for gold, answer in (("2\\sqrt{3}", r"2\sqrt{3}"), ("x^2+2x+1", "x^2 + 2x + 1"), ("1024", "2^{10}"),
                         ("1/2", r"The answer is $\frac{1}{2}$."), ("3", "x = 3"), ("x > 3", "x > 3"),
                         ("\\sqrt{2}", r"\sqrt{2}")):
        assert grade("math", gold, answer).passed, (gold, answer)


def test_exact_and_numeric_reuse_the_existing_verifiers():
    assert grade("exact", "Abc", "Abc").passed and not grade("exact", "Abc", "abc").passed
    assert grade("exact", "Abc", "abc", case_sensitive=False).passed
    assert grade("numeric", "2.5", "2.51", abs_tol=0.02).passed
    assert not grade("numeric", "2.5", "2.6", abs_tol=0.02).passed
    assert not grade("numeric", "2.5", "nan").passed


def test_regex_is_a_full_match_with_a_timeout():
    assert grade("regex", "2024-01-05", "2024-01-05", pattern=r"\d{4}-\d{2}-\d{2}").passed
    assert not grade("regex", "2024-01-05", "on 2024-01-05", pattern=r"\d{4}-\d{2}-\d{2}").passed
    assert grade("regex", "YES", "yes", pattern="yes", ignore_case=True).passed
    t0 = time.perf_counter()  # catastrophic backtracking caused by the answer fails it, in bounded time
    v = grade("regex", "aaa", "a" * 40 + "!", pattern=r"(a+)+$")
    assert not v.passed and time.perf_counter() - t0 < 10


@pytest.mark.slow
def test_math_equivalence_by_math_verify():
    pytest.importorskip("math_verify")
    assert grade("math", "\\frac{1}{2}", "0.5").passed
    assert grade("math", "\\frac{1}{2}", "The answer is \\boxed{\\frac{2}{4}}").passed
    assert grade("math", "x^2+2x+1", "(x+1)^2").passed
    assert not grade("math", "\\frac{1}{2}", "0.6").passed
    assert not grade("math", "3", "").passed
    # an answer sympy would evaluate for ever fails within the budget instead of hanging a worker
    t0 = time.perf_counter()
    v = grade("math", "3", "\\boxed{9^{9^{9^{9}}}}", timeout_s=1.0)
    assert not v.passed and "longer than" in v.details["reason"]
    assert time.perf_counter() - t0 < 30
    assert grade("math", "3", "3").passed  # the next grading gets a fresh worker


def test_math_grades_from_threads():
    pytest.importorskip("math_verify")
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda i: grade("math", str(i), f"{i}.0").passed, range(8)))
    assert got == [True] * 8


def test_json_schema_and_values():
    schema = {"type": "object", "required": ["total"], "properties": {"total": {"type": "number"}}}
    assert grade("json", '{"total": 10}', '{"total": 10.001}', schema=schema,
                 tolerance={"rel": 0, "abs": 0.01}).passed
    assert not grade("json", '{"total": 10}', '{"total": "10"}', schema=schema).passed
    assert not grade("json", '{"total": 10}', '{"total": 11}', schema=schema).passed
    nv = VERIFIERS["json"]
    wrong = nv.wrong({"total": 10, "name": "x"}, {})
    assert json.loads(wrong)["total"] != 10


def test_parameters_are_typed():
    with pytest.raises(ValueError, match=r"verifier.rel_tol: expected int or float, got 'x'"):
        VERIFIERS["numeric"].settings({"rel_tol": "x"}, "f.toml")
    with pytest.raises(ValueError, match=r"verifier.case_sensitive: expected bool"):
        VERIFIERS["exact"].settings({"case_sensitive": 1}, "f.toml")


def _jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("name,rows,query", [
    ("normalized", [{"question": f"capital {i}?", "answer": f"City {i}."} for i in range(30)], ""),
    # the prompt holds no expression equal to the answer (echoing it would pass, and the
    # self-check's echo-prompt adversary says so)
    ("math", [{"problem": f"What is half of {i}?", "answer": f"\\frac{{{i}}}{{2}}" if i % 2 else f"{i // 2}"}
              for i in range(1, 30)], ""),
    ("json", [{"question": f"total of {i} and {i}?", "answer": json.dumps({"total": 2 * i})} for i in range(30)],
     '&verifier.schema={type="object",required=["total"]}'),
    ("regex", [{"question": f"a date in {2000 + i}?", "answer": f"{2000 + i}-01-01"} for i in range(30)],
     "&verifier.pattern=" + r"\d{4}-\d{2}-\d{2}"),
])
@pytest.mark.slow
def test_each_answer_verifier_passes_the_self_check_on_a_data_source(tmp_path, name, rows, query):
    if name == "math":
        pytest.importorskip("math_verify")
    path = _jsonl(tmp_path / f"{name}.jsonl", rows)
    [d] = load_source(f"data:{path}?verifier={name}&eval_fraction=0.3{query}")
    report = check_domains([d], per_domain=6)
    assert report.ok and report.oracle_pass_rate == 1.0, [f.detail for f in report.failures]


def _bwrap_problem():
    from posttrain.sandbox.bwrap import bwrap_problem

    return bwrap_problem()


@pytest.mark.slow
@pytest.mark.skipif(_bwrap_problem() is not None, reason="needs the sandbox (bubblewrap)")
def test_unit_tests_and_script_verifiers_on_a_data_source(tmp_path):
    rows = [{"prompt": f"Write add{i}(x) returning x + {i}.", "solution": f"def add{i}(x):\n    return x + {i}\n",
             "entry": f"add{i}", "tests": f"def check(f):\n    assert f(1) == {1 + i}\n    assert f(-2) == {i - 2}\n"}
            for i in range(12)]
    path = _jsonl(tmp_path / "code.jsonl", rows)
    (tmp_path / "code.toml").write_text('answer = "solution"\neval_fraction = 0.3\n[verifier]\nname = "unit-tests"\n'
                                        '[verifier.columns]\nentry_point = "entry"\ntest = "tests"\n')
    [d] = load_source(f"data:{path}")
    assert d.stop == ()  # code spans lines: completions are not cut at a newline
    report = check_domains([d], per_domain=2)
    assert report.ok and report.tasks == 2, [f.detail for f in report.failures]
    rows = [{"question": f"say {i} twice", "answer": f"{i}{i}"} for i in range(20)]
    path = _jsonl(tmp_path / "say.jsonl", rows)
    check = "def check(answer, args):\n    return answer.strip() == args['expected']\n"
    (tmp_path / "say.toml").write_text(f'[verifier]\nname = "script"\ncheck = """{check}"""\n')
    [s] = load_source(f"data:{path}")
    report = check_domains([s], per_domain=2)
    assert report.ok, [f.detail for f in report.failures]
