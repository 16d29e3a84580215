"""Generated financial statements of fictional companies, internally consistent by construction.

A `Company` has, for each of its years, an income statement, a cash-flow statement and a
year-end balance sheet (plus the balance sheet of the year before the first, for opening
balances). All amounts are integers in USD thousands, and every identity holds exactly:

* gross profit = revenue - cost of revenue; operating income = gross profit - operating expenses;
  net income = operating income - interest - tax;
* cash from operations = net income + depreciation + change in working capital, where the
  change is -(increase in receivables + increase in inventory - increase in payables);
* net change in cash = operations + investing (-capex) + financing (net borrowing - dividends),
  and it equals the change of the balance-sheet cash line;
* PP&E = previous PP&E + capex - depreciation; retained earnings = previous + net income -
  dividends; total assets = total liabilities + total equity.

`check_identities` re-verifies all of them (the tests call it on many companies). The cash-flow
statement deliberately omits opening/closing cash: reconciling cash needs the balance sheet too.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from posttrain.tasks.families.common import content_split
from posttrain.values.task import Split

INCOME_LINES: tuple[tuple[str, str], ...] = (
    ("revenue", "Revenue"), ("cost_of_revenue", "Cost of revenue"), ("gross_profit", "Gross profit"),
    ("sga", "Selling, general and administrative"), ("rnd", "Research and development"),
    ("operating_expenses", "Total operating expenses"), ("operating_income", "Operating income"),
    ("interest_expense", "Interest expense"), ("pretax_income", "Income before income taxes"),
    ("income_tax", "Income tax expense"), ("net_income", "Net income"),
)
BALANCE_LINES: tuple[tuple[str, str], ...] = (
    ("cash", "Cash and cash equivalents"), ("accounts_receivable", "Accounts receivable"),
    ("inventory", "Inventory"), ("total_current_assets", "Total current assets"),
    ("ppe", "Property, plant and equipment, net"), ("total_assets", "Total assets"),
    ("accounts_payable", "Accounts payable"), ("short_term_debt", "Short-term debt"),
    ("total_current_liabilities", "Total current liabilities"), ("long_term_debt", "Long-term debt"),
    ("total_liabilities", "Total liabilities"), ("share_capital", "Share capital"),
    ("retained_earnings", "Retained earnings"), ("total_equity", "Total equity"),
    ("total_liabilities_and_equity", "Total liabilities and equity"),
)
CASH_FLOW_LINES: tuple[tuple[str, str], ...] = (
    ("net_income", "Net income"), ("depreciation", "Depreciation"),
    ("change_in_working_capital", "Change in working capital"),
    ("cash_from_operations", "Net cash from operating activities"),
    ("capital_expenditures", "Capital expenditures"), ("cash_from_investing", "Net cash from investing activities"),
    ("net_borrowing", "Net borrowing (repayment)"), ("dividends_paid", "Dividends paid"),
    ("cash_from_financing", "Net cash from financing activities"), ("net_change_in_cash", "Net change in cash"),
)
STATEMENTS = {"income": ("Income statement", INCOME_LINES),
              "balance": ("Balance sheet", BALANCE_LINES),
              "cash_flow": ("Cash flow statement", CASH_FLOW_LINES)}

_FIRST = ("North", "Blue", "Iron", "Silver", "Cedar", "Granite", "Harbor", "Maple", "Summit", "Willow",
          "Copper", "Orchid", "Falcon", "Lumen", "Meadow", "Pioneer", "Quartz", "River", "Sterling", "Tidal")
_SECOND = ("wind", "fin", "gate", "stone", "field", "brook", "crest", "light", "point", "ridge", "vale", "works")
_THIRD = ("Tools", "Foods", "Logistics", "Labs", "Textiles", "Energy", "Robotics", "Pharma", "Media", "Motors")


@dataclass(frozen=True)
class Company:
    name: str
    years: tuple[int, ...]
    """fiscal years reported (income and cash flow); balance sheets also exist for years[0] - 1"""
    income: dict[int, dict[str, int]]
    balance: dict[int, dict[str, int]]
    cash_flow: dict[int, dict[str, int]]

    @property
    def slug(self) -> str:
        return self.name.lower().replace(" ", "_")

    def statement(self, kind: str) -> dict[int, dict[str, int]]:
        return {"income": self.income, "balance": self.balance, "cash_flow": self.cash_flow}[kind]


def company_name(rng: random.Random, split: Split) -> str:
    """A company name of `split`: the names are partitioned by split (a name's hash, as for
    problems), so no eval problem is about a company that a training problem names. Without
    this, two problems of sibling domains about one company (its peak and its trough quarter)
    differ in their prompts only by the domains' template words, and read as duplicates."""
    while True:
        name = f"{rng.choice(_FIRST)}{rng.choice(_SECOND)} {rng.choice(_THIRD)}"
        if content_split("docs.company\x00" + name) == split:
            return name


def first_year(rng: random.Random, split: Split, keyed: bool) -> int:
    """The first fiscal year of a problem's statements (2012-2022). `keyed`: the answer is keyed
    by year (its JSON schema, stored with the task, names the years), so the years are
    partitioned by split -- eval problems start in 2014 or 2019, training ones in any other year
    -- and no eval schema is a training one (eleven schemas in all, shared by many problems)."""
    while True:
        year = rng.randint(2012, 2022)
        if not keyed or ("eval" if year % 5 == 4 else "train") == split:
            return year


def _close_balance(b: dict[str, int]) -> dict[str, int]:
    b["total_current_assets"] = b["cash"] + b["accounts_receivable"] + b["inventory"]
    b["total_assets"] = b["total_current_assets"] + b["ppe"]
    b["total_current_liabilities"] = b["accounts_payable"] + b["short_term_debt"]
    b["total_liabilities"] = b["total_current_liabilities"] + b["long_term_debt"]
    b["total_equity"] = b["share_capital"] + b["retained_earnings"]
    b["total_liabilities_and_equity"] = b["total_liabilities"] + b["total_equity"]
    return b


def make_company(rng: random.Random, name: str, first_year: int, n_years: int = 3) -> Company:
    """A company with `n_years` of statements from `first_year`, drawn from `rng` only."""
    rev = rng.randint(5_000, 500_000)
    cogs_share = rng.uniform(0.4, 0.7)
    opening = {"cash": round(rev * rng.uniform(0.05, 0.2)),
               "accounts_receivable": round(rev * rng.uniform(0.08, 0.15)),
               "inventory": round(rev * cogs_share * rng.uniform(0.1, 0.2)),
               "ppe": round(rev * rng.uniform(0.3, 0.8)),
               "accounts_payable": round(rev * cogs_share * rng.uniform(0.08, 0.15)),
               "short_term_debt": round(rev * rng.uniform(0.0, 0.05)),
               "long_term_debt": round(rev * rng.uniform(0.05, 0.2))}
    assets = opening["cash"] + opening["accounts_receivable"] + opening["inventory"] + opening["ppe"]
    liabilities = opening["accounts_payable"] + opening["short_term_debt"] + opening["long_term_debt"]
    opening["retained_earnings"] = round((assets - liabilities) * rng.uniform(0.2, 0.6))
    # assets >= 0.47 * revenue > liabilities <= 0.36 * revenue, so share capital is positive
    opening["share_capital"] = assets - liabilities - opening["retained_earnings"]
    balance = {first_year - 1: _close_balance(opening)}
    income: dict[int, dict[str, int]] = {}
    cash_flow: dict[int, dict[str, int]] = {}
    tax_rate, rate = rng.uniform(0.18, 0.3), rng.uniform(0.03, 0.08)
    for year in range(first_year, first_year + n_years):
        prev = balance[year - 1]
        rev = round(rev * (1 + rng.choice((-1, 1)) * rng.uniform(0.01, 0.25)))
        i = {"revenue": rev, "cost_of_revenue": round(rev * rng.uniform(cogs_share - 0.05, cogs_share + 0.05)),
             "sga": round(rev * rng.uniform(0.08, 0.16)), "rnd": round(rev * rng.uniform(0.01, 0.06))}
        i["gross_profit"] = i["revenue"] - i["cost_of_revenue"]
        i["operating_expenses"] = i["sga"] + i["rnd"]
        i["operating_income"] = i["gross_profit"] - i["operating_expenses"]
        i["interest_expense"] = round((prev["short_term_debt"] + prev["long_term_debt"]) * rate)
        i["pretax_income"] = i["operating_income"] - i["interest_expense"]
        i["income_tax"] = max(0, round(i["pretax_income"] * tax_rate))
        i["net_income"] = i["pretax_income"] - i["income_tax"]
        income[year] = i

        b = {"accounts_receivable": round(rev * rng.uniform(0.08, 0.15)),
             "inventory": round(i["cost_of_revenue"] * rng.uniform(0.1, 0.2)),
             "accounts_payable": round(i["cost_of_revenue"] * rng.uniform(0.08, 0.15)),
             "short_term_debt": round(rev * rng.uniform(0.0, 0.1)),
             "long_term_debt": max(0, prev["long_term_debt"] + round(rev * rng.uniform(-0.06, 0.06))),
             "share_capital": prev["share_capital"]}
        depreciation = round(prev["ppe"] * rng.uniform(0.08, 0.15))
        capex = round(rev * rng.uniform(0.03, 0.1))
        dividends = max(0, round(i["net_income"] * rng.choice((0.0, 0.2, 0.3, 0.5))))
        wc = -((b["accounts_receivable"] - prev["accounts_receivable"]) + (b["inventory"] - prev["inventory"])
               - (b["accounts_payable"] - prev["accounts_payable"]))
        cfo = i["net_income"] + depreciation + wc
        # Borrow more long-term debt if cash would fall below a floor (keeps cash positive).
        floor = round(rev * 0.02)
        borrowing = b["short_term_debt"] + b["long_term_debt"] - prev["short_term_debt"] - prev["long_term_debt"]
        shortfall = floor - (prev["cash"] + cfo - capex + borrowing - dividends)
        if shortfall > 0:
            b["long_term_debt"] += shortfall
            borrowing += shortfall
        cf = {"net_income": i["net_income"], "depreciation": depreciation, "change_in_working_capital": wc,
              "cash_from_operations": cfo, "capital_expenditures": -capex, "cash_from_investing": -capex,
              "net_borrowing": borrowing, "dividends_paid": -dividends,
              "cash_from_financing": borrowing - dividends}
        cf["net_change_in_cash"] = cf["cash_from_operations"] + cf["cash_from_investing"] + cf["cash_from_financing"]
        cash_flow[year] = cf
        b["cash"] = prev["cash"] + cf["net_change_in_cash"]
        b["ppe"] = prev["ppe"] + capex - depreciation
        b["retained_earnings"] = prev["retained_earnings"] + i["net_income"] - dividends
        balance[year] = _close_balance(b)
    company = Company(name, tuple(range(first_year, first_year + n_years)), income, balance, cash_flow)
    check_identities(company)
    return company


def check_identities(c: Company) -> None:
    """Raise AssertionError naming the first identity that does not hold."""

    def need(ok: bool, what: str, year: int) -> None:
        if not ok:
            raise AssertionError(f"{c.name} {year}: {what} does not hold")

    for y, b in c.balance.items():
        need(b["total_assets"] == b["total_liabilities"] + b["total_equity"], "assets = liabilities + equity", y)
        need(b["total_assets"] == b["total_current_assets"] + b["ppe"], "total assets", y)
        need(b["cash"] > 0 and b["share_capital"] > 0, "positive cash and share capital", y)
    for y in c.years:
        i, cf, b, p = c.income[y], c.cash_flow[y], c.balance[y], c.balance[y - 1]
        need(i["gross_profit"] == i["revenue"] - i["cost_of_revenue"], "gross profit", y)
        need(i["operating_income"] == i["gross_profit"] - i["sga"] - i["rnd"], "operating income", y)
        need(i["net_income"] == i["operating_income"] - i["interest_expense"] - i["income_tax"], "net income", y)
        need(cf["net_income"] == i["net_income"], "cash flow starts from net income", y)
        need(cf["net_change_in_cash"] == b["cash"] - p["cash"], "cash reconciles with the balance sheet", y)
        need(cf["cash_from_operations"] + cf["cash_from_investing"] + cf["cash_from_financing"]
             == cf["net_change_in_cash"], "net change in cash", y)
        need(b["ppe"] == p["ppe"] - cf["capital_expenditures"] - cf["depreciation"], "PP&E roll-forward", y)
        need(b["retained_earnings"] == p["retained_earnings"] + i["net_income"] + cf["dividends_paid"],
             "retained earnings roll-forward", y)
