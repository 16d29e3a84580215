import csv
import json
from decimal import Decimal

totals = {}
with open("/app/sales.csv") as f:
    for row in csv.DictReader(f):
        t = totals.setdefault(row["region"], {"units": 0, "revenue": Decimal(0)})
        t["units"] += int(row["units"])
        t["revenue"] += int(row["units"]) * Decimal(row["unit_price"])
report = {k: {"units": v["units"], "revenue": float(round(v["revenue"], 2))} for k, v in totals.items()}
with open("/app/report.json", "w") as f:
    json.dump(report, f, indent=2, sort_keys=True)
