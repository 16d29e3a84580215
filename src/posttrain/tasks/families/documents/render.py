"""Statements as documents: Markdown, HTML or CSV, the way filings and exports show them.

Markdown and HTML print thousands separators and negatives in parentheses ("(1,234)"); CSV
prints plain signed integers. Every document names the company, the statement and the unit.
"""

from __future__ import annotations

from html import escape

from posttrain.tasks.families.documents.statements import STATEMENTS, Company

FORMATS = ("md", "html", "csv")
UNIT = "USD thousands"


def _money(x: int) -> str:
    return f"({-x:,})" if x < 0 else f"{x:,}"


def filename(company: Company, kind: str, fmt: str) -> str:
    return f"{company.slug}_{kind}.{fmt}"


def render(company: Company, kind: str, fmt: str, years: tuple[int, ...] | None = None) -> str:
    """One statement of `company` for `years` (default: all it has), in `fmt`."""
    title, lines = STATEMENTS[kind]
    data = company.statement(kind)
    cols = tuple(sorted(data)) if years is None else years
    heading = f"{company.name}: {title}"
    note = f"{UNIT}; fiscal years ending December 31" + ("; balances at year end" if kind == "balance" else "")
    if fmt == "md":
        out = [f"# {heading}", "", f"({note})", "", "| Line item | " + " | ".join(map(str, cols)) + " |",
               "|---|" + "---:|" * len(cols)]
        out += [f"| {label} | " + " | ".join(_money(data[y][key]) for y in cols) + " |" for key, label in lines]
        return "\n".join(out) + "\n"
    if fmt == "html":
        head = "".join(f"<th>{y}</th>" for y in cols)
        rows = "".join(f"<tr><td>{escape(label)}</td>" + "".join(f"<td>{_money(data[y][key])}</td>" for y in cols)
                       + "</tr>\n" for key, label in lines)
        return (f"<h1>{escape(heading)}</h1>\n<p>{escape(note)}</p>\n<table>\n"
                f"<tr><th>Line item</th>{head}</tr>\n{rows}</table>\n")
    if fmt == "csv":
        out = [f"company,{company.name}", f"statement,{title}", f"units,{UNIT}",
               "line item," + ",".join(map(str, cols))]
        out += [f"\"{label}\"," + ",".join(str(data[y][key]) for y in cols) for key, label in lines]
        return "\n".join(out) + "\n"
    raise ValueError(f"unknown document format {fmt!r}; expected one of {FORMATS}")
