"""The docs family: consistent statements, three formats, JSON answers, cross-document questions."""

from __future__ import annotations

import csv
import io
import json
import random
import re

import pytest

from posttrain.scheduling.domain_check import check_domains
from posttrain.tasks.families import documents
from posttrain.tasks.families.common import content_split
from posttrain.tasks.families.documents.render import render
from posttrain.tasks.families.documents.statements import (
    BALANCE_LINES,
    CASH_FLOW_LINES,
    INCOME_LINES,
    check_identities,
    make_company,
)
from posttrain.verifiers.base import Outcome

DOMAINS = {d.name: d for d in documents.domains() if not d.needs_vision}  # image ones: test_vision_envs
SINGLE = [d for d in DOMAINS.values() if d.env == "single"]


def _grade(name, task, text):
    return DOMAINS[name].verifier.verify(task, Outcome(answer=text))


def test_at_least_30_domains_over_three_formats():
    assert len(SINGLE) >= 30
    assert {n.rsplit(".", 1)[1] for n in DOMAINS} == {"md", "html", "csv"}
    assert all(d.family == "docs" and d.stop == () for d in SINGLE)


def test_every_single_answer_domain_passes_the_self_check():
    # (the lookup variants are played through the environment below)
    report = check_domains(SINGLE, per_domain=2)
    assert report.ok, [(f.domain, f.kind, f.detail) for f in report.failures[:5]]
    assert report.negative_fail_rate == 1.0 and report.tasks == 2 * len(SINGLE)


def test_generated_statements_are_internally_consistent():
    for seed in range(300):
        company = make_company(random.Random(seed), "Test Co", 2015 + seed % 8)
        check_identities(company)  # raises on any broken identity
        assert len(company.years) == 3 and set(company.balance) == {company.years[0] - 1, *company.years}


def test_check_identities_catches_a_broken_statement():
    company = make_company(random.Random(1), "Test Co", 2020)
    company.balance[2021]["cash"] += 1
    with pytest.raises(AssertionError, match="2021"):
        check_identities(company)


def test_csv_documents_hold_exactly_the_statement_figures():
    company = make_company(random.Random(7), "Test Co", 2019)
    for kind, lines in (("income", INCOME_LINES), ("balance", BALANCE_LINES), ("cash_flow", CASH_FLOW_LINES)):
        rows = list(csv.reader(io.StringIO(render(company, kind, "csv"))))
        header = rows[3]
        years = [int(y) for y in header[1:]]
        for (key, label), row in zip(lines, rows[4:]):
            assert row[0] == label
            assert [int(v) for v in row[1:]] == [company.statement(kind)[y][key] for y in years]


def test_markdown_and_html_show_parenthesised_negatives():
    company = make_company(random.Random(3), "Test Co", 2019)
    md, html = render(company, "cash_flow", "md"), render(company, "cash_flow", "html")
    capex = company.cash_flow[2019]["capital_expenditures"]
    assert capex < 0 and f"({-capex:,})" in md and f"<td>({-capex:,})</td>" in html
    assert md.startswith("# Test Co: Cash flow statement") and "<table>" in html


def test_cash_reconciliation_needs_two_documents():
    name = "docs.finance.cash-reconciliation.md"
    task = DOMAINS[name].task(0)
    cash_flow = next(v for k, v in task.files.items() if k.endswith("cash_flow.md"))
    balance = next(v for k, v in task.files.items() if k.endswith("balance.md"))
    answer = task.reference["answer"]
    assert "Cash and cash equivalents" not in cash_flow and f"{answer['cash_end']:,}" in balance
    assert answer["cash_end"] == answer["cash_beginning"] + answer["net_change_in_cash"]


def test_prompt_states_the_json_form_and_answers_grade():
    name = "docs.finance.revenue-growth.html"
    task = DOMAINS[name].task(4, "eval")
    assert content_split(task.prompt, task.files) == "eval"
    assert '{"revenue_previous": integer, "revenue": integer, "growth_pct": number}' in task.prompt
    a = task.reference["answer"]
    assert a["growth_pct"] == round(100 * (a["revenue"] - a["revenue_previous"]) / a["revenue_previous"], 2)
    fenced = "```json\n" + json.dumps({**a, "growth_pct": a["growth_pct"] + 0.004}, indent=2) + "\n```"
    assert _grade(name, task, fenced).passed
    off = _grade(name, task, json.dumps({**a, "growth_pct": a["growth_pct"] + 0.01}))
    assert not off.passed and off.details["stage"] == "values"
    assert _grade(name, task, "").details["stage"] == "parse"


def test_compare_kind_uses_company_names():
    name = "docs.finance.compare-net-income.csv"
    task = DOMAINS[name].task(2)
    answer = task.reference["answer"]
    names = list(answer["net_income"])
    assert len(names) == 2 and answer["higher"] in names and len(task.files) == 2
    assert answer["difference"] == abs(answer["net_income"][names[0]] - answer["net_income"][names[1]])
    lower = {**answer, "higher": min(names, key=lambda n: answer["net_income"][n])}
    if answer["difference"]:
        assert not _grade(name, task, json.dumps(lower)).passed
    assert _grade(name, task, json.dumps({**answer, "higher": "Nobody"})).details["stage"] == "schema"


def test_generation_is_deterministic():
    d = DOMAINS["docs.finance.ppe-rollforward.csv"]
    assert d.task(11, "eval").model_dump_json() == d.task(11, "eval").model_dump_json()
    assert d.task(11, "train").prompt != d.task(12, "train").prompt
    assert all(re.fullmatch(r"[a-z_]+\.csv", f) for f in d.task(11).files)


class _MemorySandbox:
    """Just the workspace part of the Sandbox protocol, in memory: enough for tool domains whose
    tools only read files (the real sandbox is tested by its own suite)."""

    id = "memory"
    limits = None

    def __init__(self):
        from posttrain.sandbox.base import SandboxInfo

        self.info = SandboxInfo(backend="memory", image="none")
        self.files: dict[str, bytes] = {}

    def write_file(self, path, data, *, mode=0o644):
        self.files[path] = data.encode() if isinstance(data, str) else data

    def read_file(self, path):
        return self.files[path]

    def list_files(self, path="."):
        return sorted(self.files)

    def snapshot(self):
        return "snap"

    def kill_processes(self):
        return 0

    def archive(self):
        return b""


LOOKUP_DOMAINS = [d for d in DOMAINS.values() if d.env == "tools"]


def test_lookup_variants_exist_with_the_lookup_tool():
    assert len(LOOKUP_DOMAINS) == 12 and all(d.name.startswith("docs.lookup.") for d in LOOKUP_DOMAINS)
    assert all([t.name for t in d.tools] == ["lookup"] for d in LOOKUP_DOMAINS)


@pytest.mark.parametrize("domain", LOOKUP_DOMAINS[::5], ids=lambda d: d.name)
def test_lookup_oracle_passes_and_negatives_fail_through_the_environment(domain):
    from posttrain.envs import play_actions

    task = domain.task(1, "eval")
    assert task.env == "tools" and "<submit>" in task.prompt and "in the workspace" in task.prompt
    assert play_actions(domain, task, domain.oracle(task), sandbox=_MemorySandbox()).passed
    for name, actions in domain.negatives(task).items():
        assert not play_actions(domain, task, actions, sandbox=_MemorySandbox()).passed, name


def test_lookup_tool_shows_matching_lines_with_headers():
    from posttrain.tasks.families.documents.tools import lookup

    task = LOOKUP_DOMAINS[0].task(0)
    box = _MemorySandbox()
    for path, text in task.files.items():
        box.write_file(path, text)
    out = lookup(box, "  retained EARNINGS ")
    assert "balance.md: columns: | Line item |" in out and "| Retained earnings |" in out
    assert lookup(box, "zzz-not-there") == "no line contains 'zzz-not-there'"
    with pytest.raises(ValueError, match="search term"):
        lookup(box, "  ")


def test_lookup_task_split_follows_the_single_answer_problem():
    from posttrain.tasks.families.common import task_rng
    from posttrain.tasks.families.documents import _draw
    from posttrain.tasks.families.documents.questions import KINDS

    domain = next(d for d in LOOKUP_DOMAINS if d.name == "docs.lookup.ppe-rollforward.csv")
    kind = next(k for k in KINDS if k.name == "ppe-rollforward")
    for seed in range(3):
        task = domain.task(seed, "eval")
        rng = task_rng(domain.name, "eval", seed)
        problem = _draw(kind, "csv", rng, "eval")
        while content_split(problem.prompt, problem.files) != "eval":
            problem = _draw(kind, "csv", rng, "eval")
        assert problem.files == task.files  # the same problem, judged by its single-answer form
