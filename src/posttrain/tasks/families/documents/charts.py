"""Questions about a chart: `docs.chart.<kind>.<style>` (image domains, `single` env).

A company's quarterly revenue or net income over eight quarters (USD millions, integers) is
drawn as a bar or a line chart, each point labelled with its value (`pictures`: byte-identical
PNGs). The prompt names the company, the metric and the question, never a figure: the answer
is only in the chart. Answers are one line (a number or a quarter such as `Q3 2021`), checked
exactly (case and inner spaces ignored).

Textual fallback (a text-only policy): the series as a table of quarter and value, which is the
chart's content in words.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass

from posttrain.tasks.domain import Domain
from posttrain.tasks.families.common import Problem, draw_problem
from posttrain.tasks.families.documents.statements import company_name
from posttrain.tasks.families.pictures import figure, png
from posttrain.values.image import Image
from posttrain.values.task import Split, Task, TaskLimits
from posttrain.verifiers.answer import EXACT

LIMITS = TaskLimits(max_turns=1, max_tokens=16, context_tokens=2048)
QUARTERS = 8
STYLES = ("bar", "line")

Series = list[int]


@dataclass(frozen=True)
class ChartKind:
    name: str
    metric: str
    """'revenue' (positive, trending) or 'net income' (may be negative)"""
    question: Callable[[list[str], Series, random.Random], tuple[str, str, str]]
    """(quarter labels, values, rng) -> (question, answer, a plausible wrong answer)"""


def _unique_extreme(values: Series, pick: Callable) -> tuple[int, int] | None:
    best = pick(values)
    if values.count(best) != 1:
        return None
    ranked = sorted(set(values), reverse=pick is max)
    return values.index(best), values.index(ranked[1])


def _peak(labels, v, rng):
    i, j = _unique_extreme(v, max) or (None, None)
    if i is None:
        raise _Redraw
    return "In which quarter was it highest? Answer like Q1 2020.", labels[i], labels[j]


def _trough(labels, v, rng):
    i, j = _unique_extreme(v, min) or (None, None)
    if i is None:
        raise _Redraw
    return "In which quarter was it lowest? Answer like Q1 2020.", labels[i], labels[j]


def _value(labels, v, rng):
    i = rng.randrange(QUARTERS)
    j = i + 1 if i + 1 < QUARTERS else i - 1
    if v[j] == v[i]:
        raise _Redraw
    return f"What was it in {labels[i]}? Answer with the number.", str(v[i]), str(v[j])


def _change(labels, v, rng):
    i, j = sorted(rng.sample(range(QUARTERS), 2))
    if v[i] == v[j]:
        raise _Redraw
    return (f"By how much did it change from {labels[i]} to {labels[j]}? Answer with the number "
            "(negative for a decrease)."), str(v[j] - v[i]), str(v[i] - v[j])


def _year_total(labels, v, rng):
    k = rng.randrange(2)
    year = labels[4 * k].split()[1]
    total, other = sum(v[4 * k:4 * k + 4]), sum(v[4 * (1 - k):4 * (1 - k) + 4])
    if total == other:
        raise _Redraw
    return f"What was the total over the four quarters of {year}? Answer with the number.", str(total), str(other)


# The counting questions draw their answer first (uniform over COUNTS) and redraw the series
# until it has it: random series put most counts at 3-4 of 8 quarters, so answering "4" to every
# rises question passed ~40% of them (`posttrain tasks check`'s constant-answer probe).
COUNTS = range(1, QUARTERS - 1)
COUNTING = ("losses", "rises")


def _losses(labels, v, rng):
    n = sum(x < 0 for x in v)
    if n == 0:
        raise _Redraw
    wrong = QUARTERS - n if QUARTERS - n != n else n + 1
    return "In how many quarters was it negative (a loss)? Answer with the number.", str(n), str(wrong)


def _rises(labels, v, rng):
    n = sum(b > a for a, b in zip(v, v[1:]))
    wrong = str(QUARTERS - 1 - n) if QUARTERS - 1 - n != n else str(n + 1)
    return "In how many quarters did it rise from the quarter before? Answer with the number.", str(n), wrong


KINDS = (ChartKind("peak", "revenue", _peak), ChartKind("trough", "revenue", _trough),
         ChartKind("value", "revenue", _value), ChartKind("change", "net income", _change),
         ChartKind("year-total", "revenue", _year_total), ChartKind("losses", "net income", _losses),
         ChartKind("rises", "revenue", _rises))


class _Redraw(Exception):
    """The drawn series does not give the question one clear answer: draw another."""


def _series(metric: str, rng: random.Random) -> Series:
    if metric == "revenue":
        level, trend = rng.randint(40, 400), rng.uniform(-0.04, 0.08)
        return [max(5, round(level * (1 + trend) ** q * rng.uniform(0.85, 1.15))) for q in range(QUARTERS)]
    scale = rng.randint(10, 80)
    return [round(scale * rng.uniform(-0.8, 1.2)) for _ in range(QUARTERS)]


def _draw(kind: ChartKind, style: str, rng: random.Random, split: Split) -> Problem:
    want = str(rng.choice(COUNTS)) if kind.name in COUNTING else None
    while True:
        company, first_year = company_name(rng, split), rng.randint(2012, 2022)
        labels = [f"Q{q % 4 + 1} {first_year + q // 4}" for q in range(QUARTERS)]
        values = _series(kind.metric, rng)
        try:
            question, answer, wrong = kind.question(labels, values, rng)
        except _Redraw:
            continue
        if want is None or answer == want:
            break
    prompt = (f"The chart shows {company}'s quarterly {kind.metric} in USD millions. {question} "
              "Reply with only the answer.")
    data = {"company": company, "metric": kind.metric, "labels": labels, "values": values, "style": style,
            "answer": answer, "wrong": wrong}
    # the split is by the chart's content and the question, not by the prompt's words alone
    return Problem(prompt, answer, data=data, identity=json.dumps([kind.name, style, company, labels, values, question]))


def chart_image(task: Task) -> tuple[Image, ...]:
    """The chart of a task (drawn from its hidden series)."""
    r = task.reference
    labels, values = r["labels"], r["values"]
    with figure(640, 360) as fig:
        ax = fig.add_subplot()
        xs = list(range(len(values)))
        if r["style"] == "bar":
            ax.bar(xs, values, color=["#3b6fb6" if v >= 0 else "#c0504d" for v in values])
        else:
            ax.plot(xs, values, marker="o", color="#3b6fb6")
        span = (max(values) - min(min(values), 0)) or 1
        for x, v in zip(xs, values):
            ax.annotate(str(v), (x, v), textcoords="offset points", xytext=(0, 4 if v >= 0 else -12),
                        ha="center", fontsize=9)
        ax.set_ylim(min(min(values), 0) - 0.12 * span, max(max(values), 0) + 0.15 * span)
        ax.axhline(0, color="black", linewidth=0.6)
        ax.set_xticks(xs, labels, fontsize=8)
        ax.set_ylabel("USD millions")
        ax.set_title(f"{r['company']}: quarterly {r['metric']}")
        fig.subplots_adjust(left=0.11, right=0.98, bottom=0.1, top=0.9)
        return (png(fig),)


def chart_as_text(task: Task) -> str:
    r = task.reference
    rows = "\n".join(f"{q}: {v}" for q, v in zip(r["labels"], r["values"]))
    return f"The chart's data ({r['company']}, quarterly {r['metric']}, USD millions):\n{rows}"


def _domain(kind: ChartKind, style: str) -> Domain:
    name = f"docs.chart.{kind.name}.{style}"

    def generate(seed: int, split: Split) -> Task:
        p = draw_problem(name, split, seed, lambda rng: _draw(kind, style, rng, split))
        return Task(domain=name, prompt=p.prompt, reference=dict(p.data), env="single", split=split,
                    seed=seed, limits=LIMITS, tags=("docs", "chart", "vision"),
                    verifier={"case_sensitive": False, "collapse_whitespace": True})

    def negatives(task: Task) -> dict[str, list[str]]:
        r = task.reference
        out = {"empty": [""], "wrong": [r["wrong"]]}
        if r["answer"].lstrip("-").isdigit():
            out["off-by-one"] = [str(int(r["answer"]) + 1)]
            out["with-units"] = [f"{r['answer']} million"]  # the form is only the answer
        else:
            out["year-only"] = [r["answer"].split()[1]]
        return out

    return Domain(name=name, family="docs", env="single", verifier=EXACT, generate=generate,
                  oracle=lambda task: [task.reference["answer"]], negatives=negatives,
                  description=f"{kind.name} of quarterly {kind.metric}, read off a {style} chart",
                  tags=("docs", "chart", "vision"), images=chart_image, text_fallback=chart_as_text)


def domains() -> list[Domain]:
    return [_domain(kind, style) for kind in KINDS for style in STYLES]
