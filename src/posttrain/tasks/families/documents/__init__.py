"""The `docs` family: questions over generated financial documents, answered in JSON.

Domains are `docs.finance.<kind>.<format>`: 15 question kinds (see `questions.KINDS`) times 3
document formats (Markdown, HTML, CSV). A task attaches a company's income statement, balance
sheet and cash-flow statement (3 fiscal years; balance sheets also show the year before) as its
`files`; some kinds need figures from two documents (cash reconciliation, retained earnings,
PP&E roll-forward), one compares two companies. The statements are internally consistent by
construction (`statements.check_identities`).

The prompt asks for one JSON object of a stated form. The `json` verifier checks it against a
JSON Schema (all fields required, no others), then the values (integers in USD thousands
exactly; percentages and ratios rounded to 2 decimals, within 0.006), then the consistency
rules of the kind (totals add up, assets = liabilities + equity, ...). Answers may span lines,
so these domains set no stop string.

Splits are disjoint by content (prompt plus documents), like every generated family.

`docs.chart.<kind>.<style>` (see `charts.py`) are image domains: a quarterly series drawn as a
chart, with questions only the chart answers; `docs.page.<kind>` (see `pages.py`) show the
statements as page images instead of attached text.

`docs.lookup.<kind>.<format>` (see `tools.py`) are `tools`-environment variants of the
cross-document kinds: the documents sit in the workspace and a `lookup` tool finds lines.
"""

from __future__ import annotations

import json
import random
from typing import Any

from posttrain.tasks.domain import Domain
from posttrain.tasks.families.common import Problem, draw_problem
from posttrain.tasks.families.documents.questions import KINDS, Kind, decoy
from posttrain.tasks.families.documents.render import FORMATS, filename, render
from posttrain.tasks.families.documents.statements import company_name, first_year, make_company
from posttrain.values.task import Split, Task, TaskLimits
from posttrain.verifiers.structured import STRUCTURED

FORMAT_NAMES = {"md": "Markdown", "html": "HTML", "csv": "CSV"}
LIMITS = TaskLimits(max_turns=1, max_tokens=256, context_tokens=4096)
RATIO_TOLERANCE = {"rel": 0.0, "abs": 0.006}


def schema_of(value: Any, names: list[str]) -> dict[str, Any]:
    """The JSON Schema of an expected answer: same keys, all required, nothing else."""
    if isinstance(value, dict):
        return {"type": "object", "properties": {k: schema_of(v, names) for k, v in value.items()},
                "required": list(value), "additionalProperties": False}
    if isinstance(value, bool):
        return {"type": "boolean"}
    if isinstance(value, int):
        return {"type": "integer"}
    if isinstance(value, float):
        return {"type": "number"}
    return {"type": "string", "enum": names}


def form_of(value: Any, names: list[str]) -> str:
    """How the prompt shows the expected form: {"revenue": integer, "growth_pct": number}."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)}: {form_of(v, names)}" for k, v in value.items()) + "}"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    return " or ".join(json.dumps(n) for n in names)


def _float_fields(value: Any, prefix: str = "") -> list[str]:
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _float_fields(v, f"{prefix}{k}/")]
    return [prefix.rstrip("/")] if isinstance(value, float) else []


def _draw(kind: Kind, fmt: str, rng: random.Random, split: Split) -> Problem:
    start = first_year(rng, split, keyed=kind.all_years)
    names: list[str] = []
    while len(names) < kind.companies:
        name = company_name(rng, split)
        if name not in names:
            names.append(name)
    companies = [make_company(rng, n, start) for n in names]
    years = companies[0].years
    year = years[-1] if kind.all_years else rng.choice(years[1:] if kind.needs_prior_year else years)
    answer, rules = kind.build(companies, year)
    files = {filename(c, s, fmt): render(c, s, fmt) for c in companies for s in kind.statements}
    question = kind.question.format(company=names[0], year=year, other=names[-1])
    units = "Amounts are integers in USD thousands" + (
        "; percentages and ratios are rounded to 2 decimals" if _float_fields(answer) else "")
    prompt = (f"{question} The {FORMAT_NAMES[fmt]} documents {', '.join(sorted(files))} are attached. "
              f"{units}. Reply with only a JSON object of the form {form_of(answer, names)}.")
    return Problem(prompt, json.dumps(answer), files=files,
                   data={"answer": answer, "decoy": decoy(kind, companies, year), "rules": rules, "names": names})


def verifier_settings(p: Problem) -> dict[str, Any]:
    """Schema, tolerances and consistency rules of a drawn problem (see the module docstring)."""
    answer = p.data["answer"]
    return {"schema": schema_of(answer, p.data["names"]), "tolerance": {"rel": 0.0, "abs": 0.0},
            "field_tolerance": {f: RATIO_TOLERANCE for f in _float_fields(answer)},
            "consistency": p.data["rules"]}


def _negatives(task: Task) -> dict[str, list[str]]:
    answer = task.reference["answer"]
    text = json.dumps(answer)
    out = {"empty": [""], "malformed": [text[:-1]]}
    if task.reference["decoy"] != answer:
        out["wrong"] = [json.dumps(task.reference["decoy"])]
    last = list(answer)[-1]
    out["missing_field"] = [json.dumps({k: v for k, v in answer.items() if k != last})]
    as_text = {k: (f"{v:,}" if isinstance(v, int) else v) for k, v in answer.items()}
    if as_text != answer:
        out["numbers_as_text"] = [json.dumps(as_text)]
    out["extra_field"] = [json.dumps({**answer, "note": "see the income statement"})]
    return out


def _domain(kind: Kind, fmt: str) -> Domain:
    name = f"docs.finance.{kind.name}.{fmt}"

    def generate(seed: int, split: Split) -> Task:
        p = draw_problem(name, split, seed, lambda rng: _draw(kind, fmt, rng, split))
        return Task(domain=name, prompt=p.prompt, files=dict(p.files),
                    reference={"answer": p.data["answer"], "decoy": p.data["decoy"]},
                    verifier=verifier_settings(p), env="single",
                    limits=LIMITS, split=split, tags=("docs", "finance", fmt), seed=seed)

    return Domain(name=name, family="docs", env="single", verifier=STRUCTURED, generate=generate,
                  oracle=lambda task: [json.dumps(task.reference["answer"])], negatives=_negatives,
                  description=f"{kind.name} from {FORMAT_NAMES[fmt]} financial statements",
                  tags=("docs", "finance", fmt), stop=())


def domains() -> list[Domain]:
    from posttrain.tasks.families.documents import charts, pages
    from posttrain.tasks.families.documents.tools import tool_domains

    return [_domain(kind, fmt) for kind in KINDS for fmt in FORMATS] + tool_domains() + charts.domains() + pages.domains()
