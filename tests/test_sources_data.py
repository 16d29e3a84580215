"""Datasets as domains with no code: `data:PATH` sources, their split, self-check and errors."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from posttrain.scheduling.domain_check import check_domains
from posttrain.tasks import registry
from posttrain.tasks.domain import NoTasksInSplit
from posttrain.tasks.sources import SourceError, load_source, use_sources

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _fresh_registry():
    registry.reset_cache()
    yield
    registry.reset_cache()


def write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def qa_rows(n=200):
    return [{"question": f"{a}*{b}+{i}=", "answer": str(a * b + i)}
            for i, (a, b) in enumerate((i % 13, i % 7) for i in range(n))]


def all_tasks(domain, split):
    try:
        first = domain.task(0, split)
    except NoTasksInSplit:
        return []
    out, seed = [first], 1
    while True:
        t = domain.task(seed, split)
        if t.key == first.key:
            return out
        out.append(t)
        seed += 1


def test_a_question_answer_jsonl_is_a_domain_with_disjoint_splits(tmp_path):
    rows = qa_rows(200) + [{"question": "1*1+0=", "answer": "1"}] * 3  # duplicates of one prompt
    path = write_jsonl(tmp_path / "qa.jsonl", rows)
    [domain] = use_sources([f"data:{path}"])
    assert domain.name == "data.qa" and registry.get_domain("data.qa") is domain
    train, eval_ = all_tasks(domain, "train"), all_tasks(domain, "eval")
    assert len(train) + len(eval_) == len(rows)
    assert 0 < len(eval_) < len(train)  # eval_fraction 0.1 by default
    # disjoint by content: no prompt in both splits (the three duplicates sit in one split)
    assert not {t.prompt for t in train} & {t.prompt for t in eval_}
    t = domain.task(12345, "train")
    assert t == domain.task(12345, "train") and t.key.startswith("data.qa/train/row")
    assert t.reference == {"answer": rows[int(t.key.rsplit("row", 1)[1])]["answer"]}
    assert domain.task(t.seed, "train") == t  # the trainer regenerates a task from its seed
    report = check_domains([domain], per_domain=20)
    assert report.ok and report.tasks == 20, [f.detail for f in report.failures]
    negs = domain.negatives(t)
    assert set(negs) == {"empty", "wrong", "other_row"} and negs["other_row"] != [t.reference["answer"]]
    # the same contamination check as built-in domains finds nothing to refuse
    from posttrain.evaluation.contamination import check_contamination

    assert check_contamination(train, eval_).ok


def test_split_does_not_depend_on_row_order(tmp_path):
    rows = qa_rows(120)
    a = load_source(f"data:{write_jsonl(tmp_path / 'a.jsonl', rows)}")[0]
    b = load_source(f"data:{write_jsonl(tmp_path / 'b.jsonl', rows[::-1])}")[0]
    assert {t.prompt for t in all_tasks(a, "eval")} == {t.prompt for t in all_tasks(b, "eval")}


def test_sidecar_toml_template_numeric_verifier_and_query_override(tmp_path):
    rows = [{"x": i, "y": i + 0.5, "sum": 2 * i + 0.5} for i in range(60)]
    path = write_jsonl(tmp_path / "sums.jsonl", rows)
    (tmp_path / "sums.toml").write_text(
        'name = "sums"\ntemplate = "{x}+{y}="\nanswer = "sum"\neval_fraction = 0.5\n'
        '[verifier]\nname = "numeric"\nabs_tol = 0.01\n')
    [d] = load_source(f"data:{path}")
    t = d.task(0, "train")
    assert d.name == "data.sums" and t.prompt.endswith("=") and t.verifier == {"abs_tol": 0.01}
    from posttrain.verifiers.base import Outcome

    want = float(t.reference["answer"])
    assert d.verifier.verify(t, Outcome(answer=f"{want + 0.005}")).passed
    assert not d.verifier.verify(t, Outcome(answer=f"{want + 0.02}")).passed
    assert check_domains([d], per_domain=10).ok
    # the query wins over the file
    [q] = load_source(f"data:{path}?name=sums2&eval_fraction=0&verifier.abs_tol=0.5")
    assert q.name == "data.sums2" and q.task(0, "train").verifier == {"abs_tol": 0.5}
    with pytest.raises(NoTasksInSplit):
        q.task(0, "eval")
    # a source given as its own TOML file, with the data path relative to it
    (tmp_path / "spec.toml").write_text('path = "sums.jsonl"\nname = "viaspec"\nanswer = "sum"\n'
                                        'template = "{x}+{y}="\nverifier = {name = "numeric"}\n')
    [s] = load_source(f"data:{tmp_path / 'spec.toml'}")
    assert s.name == "data.viaspec" and s.verifier.name == "numeric"


def test_parquet_and_a_saved_dataset_folder(tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = qa_rows(50)
    ds = datasets.Dataset.from_list(rows)
    ds.to_parquet(str(tmp_path / "pq.parquet"))
    datasets.DatasetDict({"train": ds.select(range(40)), "test": ds.select(range(40, 50))}).save_to_disk(
        str(tmp_path / "saved"))
    [p] = load_source(f"data:{tmp_path / 'pq.parquet'}")
    [s] = load_source(f"data:{tmp_path / 'saved'}?name=saved")
    for d in (p, s):
        n = len(all_tasks(d, "train")) + len(all_tasks(d, "eval"))
        assert n == 50 and check_domains([d], per_domain=5).ok
    assert {t.prompt for t in all_tasks(p, "eval")} == {t.prompt for t in all_tasks(s, "eval")}


def test_split_column(tmp_path):
    rows = [{**r, "split": "test" if i % 4 == 0 else "train"} for i, r in enumerate(qa_rows(40))]
    [d] = load_source(f"data:{write_jsonl(tmp_path / 'c.jsonl', rows)}?split_column=split")
    assert len(all_tasks(d, "eval")) == 10 and len(all_tasks(d, "train")) == 30


@pytest.mark.parametrize("rows,query,expected", [
    ([{"question": "1+1=", "answer": "2"}, {"question": "2+2="}], "",
     r"bad.jsonl:2 \(row 1\): column 'answer': missing"),
    ([{"question": "1+1=", "answer": "2"}, {"question": "", "answer": "4"}], "",
     r"bad.jsonl:2 \(row 1\): column 'question': expected a non-empty prompt"),
    ([{"question": "1+1=", "answer": "two"}], "?verifier=numeric",
     r"bad.jsonl:1 \(row 0\): column 'answer': not a plain number: 'two' \(verifier numeric\)"),
    ([{"question": "1+1=", "answer": "2"}], "?verifier=numeric&verifier.rel_tl=0.1",
     r"verifier.rel_tl: unknown parameter of the 'numeric' verifier \(known: abs_tol, rel_tol\)"),
    ([{"question": "1+1=", "answer": "2"}], "?verifier=fuzzy", r"unknown verifier 'fuzzy'"),
    ([{"q": "1+1=", "answer": "2"}], "", r"no prompt column: name it"),
    ([{"question": "1+1=", "answer": "2"}], "?answer=solution", r"answer column 'solution' is not in the data"),
    ([{"question": "code?", "answer": "a\nb"}], "",
     r"bad.jsonl:1 \(row 0\): column 'answer': the answer spans several lines.*multiline = true"),
    ([{"question": "1+1=", "answer": "2"}], "?verifier=regex", r"verifier.pattern: the 'regex' verifier needs it"),
    ([{"question": "1+1=", "answer": "2"}], "?eval_fraction=2", r"eval_fraction: Input should be less"),
])
def test_errors_name_the_file_row_and_column(tmp_path, rows, query, expected):
    path = write_jsonl(tmp_path / "bad.jsonl", rows)
    with pytest.raises(SourceError, match=expected):
        load_source(f"data:{path}{query}")


def test_invalid_json_line_and_unknown_kind(tmp_path):
    path = tmp_path / "broken.jsonl"
    path.write_text('{"question": "1+1=", "answer": "2"}\n{"question": \n')
    with pytest.raises(SourceError, match=r"broken.jsonl:2: invalid JSON"):
        load_source(f"data:{path}")
    with pytest.raises(SourceError, match=r"unknown task source 'hub:x'"):
        load_source("hub:x")
    with pytest.raises(SourceError, match=r"no such file"):
        load_source(f"data:{tmp_path / 'missing.jsonl'}")


def test_a_name_taken_by_another_source_is_refused(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", qa_rows(20))
    use_sources([f"data:{a}?name=same"])
    use_sources([f"data:{a}?name=same"])  # the same source again: fine
    b = write_jsonl(tmp_path / "b.jsonl", qa_rows(20))
    with pytest.raises(SourceError, match="registered twice"):
        use_sources([f"data:{b}?name=same"])


def test_a_verifier_that_accepts_anything_fails_the_self_check(tmp_path):
    path = write_jsonl(tmp_path / "lax.jsonl", qa_rows(30))
    [d] = load_source(f"data:{path}?verifier=regex&verifier.pattern=.*")
    report = check_domains([d], per_domain=3)
    assert not report.ok and "negative_passed" in {f.kind for f in report.failures}


def _cli(args, cwd):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run([sys.executable, "-m", "posttrain.cli", *args], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=300)


@pytest.mark.slow
def test_cli_tasks_check_show_eval_and_rollout_take_a_source(tmp_path):
    write_jsonl(tmp_path / "qa.jsonl", qa_rows(100))
    p = _cli(["tasks", "check", "--source", "data:qa.jsonl", "--per-domain", "8", "--json"], tmp_path)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["tasks"] == 8
    p = _cli(["tasks", "show", "data.qa", "--source", "data:qa.jsonl", "--json"], tmp_path)
    assert p.returncode == 0 and json.loads(p.stdout)["domain"] == "data.qa"
    p = _cli(["eval", "--policy", "oracle", "--source", "data:qa.jsonl", "--per-domain", "5", "--json"], tmp_path)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["domains"]["data.qa"]["pass@1"]["value"] == 1.0
    p = _cli(["rollout", "--source", "data:qa.jsonl", "--domains", "data.qa", "--n", "3",
              "--run-dir", "r", "--json"], tmp_path)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["episodes"] == 3
    p = _cli(["tasks", "check", "--source", "data:qa.jsonl?verifier=numeric&verifier.tol=1"], tmp_path)
    assert p.returncode == 2 and "verifier.tol: unknown parameter" in p.stderr
    assert "Traceback" not in p.stderr
