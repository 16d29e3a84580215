"""Question kinds over generated statements: what is asked, the expected JSON, its rules.

Each kind builds, for a company (or two) and a fiscal year, the expected answer object and the
consistency rules that tie its figures together (see `posttrain.verifiers.structured`). Integer
fields are USD thousands, compared exactly; fields ending in `_pct` or `_ratio`/`to_equity` are
rounded to 2 decimals and compared within 0.006.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from posttrain.tasks.families.documents.statements import Company

Answer = dict[str, Any]
Rule = dict[str, Any]


def linear(name: str, total: str, **terms: float) -> Rule:
    return {"kind": "linear", "name": name, "total": total, "terms": dict(terms)}


def ratio(name: str, result: str, num: dict[str, float], den: dict[str, float], scale: float = 1.0) -> Rule:
    return {"kind": "ratio", "name": name, "result": result, "num": num, "den": den, "scale": scale}


@dataclass(frozen=True)
class Kind:
    name: str
    question: str
    """what is asked; {company}, {year} and {other} (the second company) are filled in"""
    build: Callable[[list[Company], int], tuple[Answer, list[Rule]]]
    """(companies, year) -> (expected answer, consistency rules)"""
    statements: tuple[str, ...] = ("income", "balance", "cash_flow")
    """which statements are attached (the others would be distractors anyway)"""
    companies: int = 1
    needs_prior_year: bool = False
    """the question compares a year with the one before (so never the first reported year)"""
    all_years: bool = False
    """the question covers every reported year (the decoy then shifts rows, not years)"""


def _i(c: Company, y: int) -> dict[str, int]:
    return c.income[y]


def _b(c: Company, y: int) -> dict[str, int]:
    return c.balance[y]


def _cf(c: Company, y: int) -> dict[str, int]:
    return c.cash_flow[y]


def _income_lines(cs, y):
    i = _i(cs[0], y)
    return ({"revenue": i["revenue"], "cost_of_revenue": i["cost_of_revenue"], "gross_profit": i["gross_profit"]},
            [linear("gross profit = revenue - cost of revenue", "gross_profit", revenue=1, cost_of_revenue=-1)])


def _operating(cs, y):
    i = _i(cs[0], y)
    return ({"gross_profit": i["gross_profit"], "operating_expenses": i["operating_expenses"],
             "operating_income": i["operating_income"]},
            [linear("operating income = gross profit - operating expenses", "operating_income",
                    gross_profit=1, operating_expenses=-1)])


def _net_bridge(cs, y):
    i = _i(cs[0], y)
    return ({"operating_income": i["operating_income"], "interest_expense": i["interest_expense"],
             "income_tax": i["income_tax"], "net_income": i["net_income"]},
            [linear("net income = operating income - interest - tax", "net_income",
                    operating_income=1, interest_expense=-1, income_tax=-1)])


def _balance_totals(cs, y):
    b = _b(cs[0], y)
    return ({"total_assets": b["total_assets"], "total_liabilities": b["total_liabilities"],
             "total_equity": b["total_equity"]},
            [linear("assets = liabilities + equity", "total_assets", total_liabilities=1, total_equity=1)])


def _current_ratio(cs, y):
    b = _b(cs[0], y)
    ca, cl = b["total_current_assets"], b["total_current_liabilities"]
    return ({"total_current_assets": ca, "total_current_liabilities": cl, "current_ratio": round(ca / cl, 2)},
            [ratio("current ratio = current assets / current liabilities", "current_ratio",
                   {"total_current_assets": 1}, {"total_current_liabilities": 1})])


def _working_capital(cs, y):
    b = _b(cs[0], y)
    ca, cl = b["total_current_assets"], b["total_current_liabilities"]
    return ({"total_current_assets": ca, "total_current_liabilities": cl, "working_capital": ca - cl},
            [linear("working capital = current assets - current liabilities", "working_capital",
                    total_current_assets=1, total_current_liabilities=-1)])


def _debt_to_equity(cs, y):
    b = _b(cs[0], y)
    debt = b["short_term_debt"] + b["long_term_debt"]
    return ({"short_term_debt": b["short_term_debt"], "long_term_debt": b["long_term_debt"], "total_debt": debt,
             "total_equity": b["total_equity"], "debt_to_equity": round(debt / b["total_equity"], 2)},
            [linear("total debt = short-term + long-term debt", "total_debt", short_term_debt=1, long_term_debt=1),
             ratio("debt to equity = total debt / total equity", "debt_to_equity",
                   {"total_debt": 1}, {"total_equity": 1})])


def _growth(cs, y):
    now, before = _i(cs[0], y)["revenue"], _i(cs[0], y - 1)["revenue"]
    return ({"revenue_previous": before, "revenue": now, "growth_pct": round(100 * (now - before) / before, 2)},
            [ratio("growth = (revenue - previous) / previous", "growth_pct",
                   {"revenue": 1, "revenue_previous": -1}, {"revenue_previous": 1}, 100.0)])


def _net_margin(cs, y):
    i = _i(cs[0], y)
    return ({"revenue": i["revenue"], "net_income": i["net_income"],
             "net_margin_pct": round(100 * i["net_income"] / i["revenue"], 2)},
            [ratio("net margin = net income / revenue", "net_margin_pct", {"net_income": 1}, {"revenue": 1}, 100.0)])


def _fcf(cs, y):
    cf = _cf(cs[0], y)
    capex = -cf["capital_expenditures"]
    return ({"cash_from_operations": cf["cash_from_operations"], "capital_expenditures": capex,
             "free_cash_flow": cf["cash_from_operations"] - capex},
            [linear("free cash flow = operating cash flow - capex", "free_cash_flow",
                    cash_from_operations=1, capital_expenditures=-1)])


def _cash_reconciliation(cs, y):
    c = cs[0]
    return ({"cash_beginning": _b(c, y - 1)["cash"], "net_change_in_cash": _cf(c, y)["net_change_in_cash"],
             "cash_end": _b(c, y)["cash"]},
            [linear("ending cash = beginning cash + net change", "cash_end", cash_beginning=1, net_change_in_cash=1)])


def _retained_earnings(cs, y):
    c = cs[0]
    return ({"retained_earnings_beginning": _b(c, y - 1)["retained_earnings"], "net_income": _i(c, y)["net_income"],
             "dividends_paid": -_cf(c, y)["dividends_paid"], "retained_earnings_end": _b(c, y)["retained_earnings"]},
            [linear("ending = beginning + net income - dividends", "retained_earnings_end",
                    retained_earnings_beginning=1, net_income=1, dividends_paid=-1)])


def _ppe(cs, y):
    c = cs[0]
    return ({"ppe_beginning": _b(c, y - 1)["ppe"], "capital_expenditures": -_cf(c, y)["capital_expenditures"],
             "depreciation": _cf(c, y)["depreciation"], "ppe_end": _b(c, y)["ppe"]},
            [linear("ending PP&E = beginning + capex - depreciation", "ppe_end",
                    ppe_beginning=1, capital_expenditures=1, depreciation=-1)])


def _revenue_total(cs, y, line: str = "revenue"):
    c = cs[0]
    by_year = {str(yr): c.income[yr][line] for yr in c.years}
    return ({"revenue_by_year": by_year, "total_revenue": sum(by_year.values())},
            [linear("total = sum of the years", "total_revenue", **{f"revenue_by_year/{k}": 1 for k in by_year})])


def _compare(cs, y):
    a, b = cs
    ni = {a.name: _i(a, y)["net_income"], b.name: _i(b, y)["net_income"]}
    hi, lo = sorted(ni, key=lambda n: (-ni[n], n))
    return ({"net_income": ni, "higher": hi, "difference": ni[hi] - ni[lo]},
            [linear("difference = higher - lower net income", "difference",
                    **{f"net_income/{hi}": 1, f"net_income/{lo}": -1})])


KINDS: tuple[Kind, ...] = (
    Kind("income-lines", "What were {company}'s revenue, cost of revenue and gross profit in fiscal {year}?",
         _income_lines),
    Kind("operating-income", "What were {company}'s gross profit, total operating expenses and operating income "
         "in fiscal {year}?", _operating),
    Kind("net-income-bridge", "Bridge {company}'s operating income to net income for fiscal {year}: operating "
         "income, interest expense, income tax and net income.", _net_bridge),
    Kind("balance-totals", "What were {company}'s total assets, total liabilities and total equity at the end of "
         "fiscal {year}?", _balance_totals),
    Kind("current-ratio", "Compute {company}'s current ratio at the end of fiscal {year} from its total current "
         "assets and total current liabilities.", _current_ratio),
    Kind("working-capital", "Compute {company}'s working capital (current assets minus current liabilities) at the "
         "end of fiscal {year}.", _working_capital),
    Kind("debt-to-equity", "Compute {company}'s total debt (short-term plus long-term) and its debt-to-equity ratio "
         "at the end of fiscal {year}.", _debt_to_equity),
    Kind("revenue-growth", "By what percentage did {company}'s revenue grow in fiscal {year} compared with the "
         "year before?", _growth, needs_prior_year=True),
    Kind("net-margin", "What was {company}'s net margin (net income as a percentage of revenue) in fiscal {year}?",
         _net_margin),
    Kind("free-cash-flow", "Compute {company}'s free cash flow for fiscal {year}: net cash from operating "
         "activities minus capital expenditures (report capital expenditures as a positive amount).", _fcf),
    Kind("cash-reconciliation", "Reconcile {company}'s cash for fiscal {year}: cash at the beginning of the year "
         "(from the balance sheet), the net change in cash (from the cash flow statement) and cash at year end.",
         _cash_reconciliation),
    Kind("retained-earnings", "Roll {company}'s retained earnings forward through fiscal {year}: the beginning "
         "balance, net income, dividends paid (as a positive amount) and the ending balance.", _retained_earnings),
    Kind("ppe-rollforward", "Roll {company}'s property, plant and equipment forward through fiscal {year}: the "
         "beginning balance, capital expenditures and depreciation (both positive amounts) and the ending balance.",
         _ppe),
    Kind("revenue-total", "List {company}'s revenue for every fiscal year in its income statement, keyed by year, "
         "and the total over those years.", _revenue_total, statements=("income", "cash_flow"), all_years=True),
    Kind("compare-net-income", "Which company had the higher net income in fiscal {year}, {company} or {other}, "
         "and by how much? Give both net incomes keyed by company name.", _compare,
         statements=("income",), companies=2),
)


def decoy(kind: Kind, companies: list[Company], year: int) -> Answer:
    """A plausible wrong answer: the same figures for a neighbouring year (or, for questions
    over all years, the cost-of-revenue row instead of revenue)."""
    if kind.all_years:
        return _revenue_total(companies, year, line="cost_of_revenue")[0]
    years = companies[0].years
    other = year - 1 if year - 1 in years and (not kind.needs_prior_year or year - 1 > years[0]) else year + 1
    return kind.build(companies, other)[0]
