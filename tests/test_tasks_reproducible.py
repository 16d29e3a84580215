"""The same (seed, split) gives a byte-identical task in *another process* too.

Within-process determinism (checked by `posttrain tasks check`) is not enough: Ray workers,
resumed runs and replays regenerate tasks elsewhere, where Python's string hashing (and so set
and dict iteration over strings) differs unless PYTHONHASHSEED is fixed.
"""

import json
import os
import subprocess
import sys

import pytest

SCRIPT = """
import json
from posttrain.tasks.domain import NoTasksInSplit
from posttrain.tasks.registry import all_domains
out = {}
for name, d in all_domains().items():
    hashes = []
    for seed in (0, 1):
        for split in ("train", "eval"):
            try:
                hashes.append(d.task(seed, split).hash)
            except NoTasksInSplit:
                hashes.append(None)
    out[name] = hashes
print(json.dumps(out))
"""


def _hashes(hash_seed: str) -> dict:
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    p = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout)


@pytest.mark.slow
def test_every_domain_generates_the_same_tasks_in_another_process():
    a, b = _hashes("1"), _hashes("2")
    assert len(a) >= 300 and set(a) == set(b)
    differ = sorted(name for name in a if a[name] != b[name])
    assert not differ, f"tasks depend on the process's hash seed: {differ}"
