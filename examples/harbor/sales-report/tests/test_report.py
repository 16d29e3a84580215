"""report.json must match totals recomputed here from the original CSV (kept in /tests)."""
import csv
import json
from decimal import Decimal
from pathlib import Path


def expected():
    out = {}
    with open("/tests/sales_original.csv") as f:
        for row in csv.DictReader(f):
            r = out.setdefault(row["region"], {"units": 0, "revenue": Decimal(0)})
            r["units"] += int(row["units"])
            r["revenue"] += int(row["units"]) * Decimal(row["unit_price"])
    return {k: {"units": v["units"], "revenue": float(round(v["revenue"], 2))} for k, v in out.items()}


def test_report():
    report = json.loads(Path("/app/report.json").read_text())
    want = expected()
    assert sorted(report) == sorted(want)
    for region, totals in want.items():
        assert report[region]["units"] == totals["units"], region
        assert abs(float(report[region]["revenue"]) - totals["revenue"]) < 0.005, region
