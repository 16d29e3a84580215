#!/bin/bash
# plausible but wrong: revenue summed from unit prices, forgetting the units
python3 - <<'PY'
import csv, json
totals = {}
for row in csv.DictReader(open("/app/sales.csv")):
    t = totals.setdefault(row["region"], {"units": 0, "revenue": 0.0})
    t["units"] += int(row["units"])
    t["revenue"] = round(t["revenue"] + float(row["unit_price"]), 2)
json.dump(totals, open("/app/report.json", "w"))
PY
