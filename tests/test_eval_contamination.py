"""Contamination: found when planted (exact and near), not found when absent; the training guard."""

import json
import random
from itertools import product

import pytest
from typer.testing import CliRunner

from posttrain.cli import app as root_app
from posttrain.evaluation.contamination import (
    ContaminationConfig,
    ContaminationError,
    _fields,
    _shingles,
    check_contamination,
    guard_training,
)
from posttrain.evaluation.tasksets import tasks_from_domains
from posttrain.values.task import Task

runner = CliRunner()
_vocab = random.Random(42)
WORDS = ["".join(_vocab.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(_vocab.randint(3, 9)))
         for _ in range(400)]


def essay(rng: random.Random, n: int = 60) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n)) + "."


def doc_task(i: int, split: str, prompt: str, files=None, reference=None) -> Task:
    return Task(domain="docs.summarize", prompt=prompt, files=files or {}, reference=reference, split=split,
                seed=i, env="single")


def test_real_families_are_clean():
    # content-disjoint splits: no eval problem is also a training problem
    train = tasks_from_domains("math.add.*,math.mul.*,text.*", 30, "train")
    evals = tasks_from_domains("math.add.*,math.mul.*,text.*", 10, "eval")
    report = check_contamination(train, evals)
    assert report.ok, report.matches[:3]
    assert report.n_train == len(train) and report.n_eval == len(evals)


def test_planted_exact_copy_is_found():
    train = tasks_from_domains("math.add.d3,text.sort.l5", 30, "train")
    evals = tasks_from_domains("math.add.d3,text.sort.l5", 10, "eval")
    leaked = evals[4][1]
    # the same problem under another key and seed, put into the training set
    train.append((None, leaked.model_copy(update={"split": "train", "seed": 999, "key": "planted"})))
    report = check_contamination(train, evals)
    assert not report.ok and report.leaked_eval_hashes == {leaked.hash}
    m = report.matches[0]
    assert (m.kind, m.field, m.train_key, m.eval_key) == ("exact", "problem", "planted", leaked.key)
    assert report.by_domain() == {leaked.domain: 1}


def test_letter_case_is_part_of_a_problem():
    # "swapcase aBc=" and "swapcase AbC=" are two problems (different answers); a copy that only
    # differs in spacing is the same problem
    train = [doc_task(0, "train", "swapcase aBc="), doc_task(1, "train", "upper  xyz =")]
    evals = [doc_task(2, "eval", "swapcase AbC="), doc_task(3, "eval", "upper xyz =")]
    report = check_contamination(train, evals)
    assert report.leaked_eval_hashes == {evals[1].hash}
    assert [(m.eval_key, m.kind) for m in report.matches] == [(evals[1].key, "exact")]


def test_planted_near_duplicates_are_found_in_prompts_files_and_references():
    rng = random.Random(0)
    train = [doc_task(i, "train", essay(rng), files={"notes.txt": essay(rng)}) for i in range(40)]
    evals = [doc_task(100 + i, "eval", essay(rng), files={"notes.txt": essay(rng)}) for i in range(20)]
    assert check_contamination(train, evals).ok      # random essays do not overlap
    src = evals[3].prompt.split()
    src[10] = "zebra"                                 # a one-word edit of an eval prompt ...
    train.append(doc_task(500, "train", " ".join(src), files=dict(evals[3].files)))  # ... same files
    other = evals[5].prompt.split()
    other[10] = "zebra"                               # the same question over other files: a new problem
    train.append(doc_task(504, "train", " ".join(other), files={"notes.txt": essay(rng)}))
    train.append(doc_task(501, "train", essay(rng), files={"notes.txt": evals[7].files["notes.txt"] + " ok"}))
    solution = {"answer": essay(rng, 30)}
    evals.append(doc_task(502, "eval", essay(rng), reference=solution))
    train.append(doc_task(503, "train", essay(rng), reference=solution))
    report = check_contamination(train, evals)
    found = {(m.eval_key, m.field, m.kind) for m in report.matches}
    assert (evals[3].key, "prompt", "near") in found
    assert not any(key == evals[5].key for key, _, _ in found)
    assert (evals[7].key, "files", "near") in found
    assert (evals[-1].key, "reference", "exact") in found and len(report.leaked_eval_hashes) == 3
    sims = [m.similarity for m in report.matches if m.kind == "near"]
    assert all(0.8 <= s <= 1.0 for s in sims)


def test_lsh_agrees_with_brute_force_jaccard():
    rng = random.Random(3)
    base = [essay(rng, 40) for _ in range(30)]
    evals = [doc_task(i, "eval", p) for i, p in enumerate(base)]
    train = []
    for i, p in enumerate(base[:15]):                 # edited copies of half of them
        words = p.split()
        for j in rng.sample(range(len(words)), k=i % 6):
            words[j] = "zebra"
        train.append(doc_task(200 + i, "train", " ".join(words)))
    train += [doc_task(300 + i, "train", essay(rng, 40)) for i in range(30)]
    # no template removal: random words shared by a tenth of the essays would be template, and
    # the brute force below compares whole shingle sets
    cfg = ContaminationConfig(threshold=0.7, template_min_tasks=10 ** 6)
    report = check_contamination(train, evals, config=cfg)
    truth = set()
    for e, t in product(evals, train):
        a = _shingles(_fields(e)["prompt"], cfg.ngram)
        b = _shingles(_fields(t)["prompt"], cfg.ngram)
        if len(a & b) / len(a | b) >= cfg.threshold:
            truth.add(e.key)
    assert truth and {m.eval_key for m in report.matches} == truth


def test_shared_templates_are_not_near_duplicates():
    rng = random.Random(5)
    template = ("A shop keeps a ledger of its sales. Read the ledger in sales.csv and report the total revenue "
                "of the month for the product named {name}, rounded to two decimals.")
    names = [f"{rng.choice(WORDS)}-{rng.randrange(10 ** 6)}" for _ in range(60)]
    train = [doc_task(i, "train", template.format(name=n)) for i, n in enumerate(names[:40])]
    evals = [doc_task(100 + i, "eval", template.format(name=n)) for i, n in enumerate(names[40:])]
    assert check_contamination(train, evals).ok


def test_guard_refuses_records_and_can_be_overridden(tmp_path):
    leaked = doc_task(1, "eval", "Summarize the attached report in three sentences, please.")
    report = check_contamination([leaked.model_copy(update={"split": "train"})], [leaked])
    with pytest.raises(ContaminationError, match="1 eval task"):
        guard_training(report, tmp_path)
    saved = json.loads((tmp_path / "contamination.json").read_text())
    assert saved["refused"] and not saved["overridden"] and saved["leaked_eval_tasks"] == 1
    guard_training(report, tmp_path, allow=True)
    saved = json.loads((tmp_path / "contamination.json").read_text())
    assert saved["overridden"] and not saved["refused"]
    clean = check_contamination([doc_task(2, "train", "Count the words in notes.txt and answer.")], [leaked])
    guard_training(clean, tmp_path)
    assert json.loads((tmp_path / "contamination.json").read_text())["ok"] is True


def test_cli_contamination(tmp_path):
    res = runner.invoke(root_app, ["tasks", "contamination", "--train", "text.sort.*", "--train-n", "20",
                                   "--eval-n", "5", "--json"])
    assert res.exit_code == 0, res.output
    body = json.loads(res.output)
    assert body["ok"] and body["n_eval"] > 0
    leaked = tasks_from_domains("text.sort.l5", 3, "eval")[0][1]
    path = tmp_path / "train.jsonl"
    path.write_text(leaked.model_copy(update={"split": "train"}).model_dump_json() + "\n")
    res = runner.invoke(root_app, ["tasks", "contamination", "--train", str(path), "--eval", "text.sort.l5",
                                   "--eval-n", "3"])
    assert res.exit_code == 1 and "1 eval task(s) leak" in res.output
    bad = runner.invoke(root_app, ["tasks", "contamination", "--threshold", "1.5"])
    assert bad.exit_code == 2 and "threshold" in bad.output
