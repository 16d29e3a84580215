#!/bin/bash
# plausible but wrong: fixes mode, but "fixes" median with the upper of the two middle values
python3 - <<'PY'
p = "/app/src/stats.py"
s = open(p).read()
s = s.replace("    counts = {}\n", "    if not xs:\n        return None\n    counts = {}\n", 1)
s = s.replace("return s[len(s) // 2]", "return s[len(s) // 2] if len(s) % 2 else s[len(s) // 2]")
open(p, "w").write(s)
PY
