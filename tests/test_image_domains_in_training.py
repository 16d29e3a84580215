"""A text-only policy trains on image domains through their textual fallbacks, as it is
evaluated on them: the breadth-agent smoke run found every training episode of docs.chart and
docs.page an infra_error ("this policy renders text only, and the request carries 1 image(s)")
while its evaluation of the same domains ran."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_pipeline import _random_llama  # a random tiny Llama with the shipped tokenizer

ROOT = Path(__file__).resolve().parents[1]

CONFIG = """
name = "pictures"
runs_dir = "{runs}"
steps = 1
[model]
path = "{model}"
[domains]
train = ["docs.chart.peak.line", "math.add.d1"]
[rollout]
group_size = 2
groups_per_step = 4
max_tokens = 8
[eval]
tasks_per_domain = 1
samples = 1
[trainer]
lr = 1e-4
"""




@pytest.mark.slow
def test_a_text_policy_trains_on_an_image_domain_through_its_fallback(tmp_path):
    model = _random_llama(tmp_path / "llama", context=1024)
    cfg = tmp_path / "pictures.toml"
    cfg.write_text(CONFIG.format(runs=tmp_path / "runs", model=model))
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    p = subprocess.run([sys.executable, "-m", "posttrain.cli", "run", str(cfg), "--json"], capture_output=True,
                       text=True, env=env, cwd=ROOT, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:] + p.stdout[-3000:]
    assert json.loads(p.stdout.strip().splitlines()[-1])["steps"] == 1
    from posttrain.storage.store import Store
    with Store.for_run_dir(tmp_path / "runs" / "pictures", readonly=True) as store:
        charts = list(store.trajectories(run_id="pictures", domain="docs.chart.peak.line", split="train"))
        assert charts and all(t.status != "infra_error" for t in charts), charts[0].error if charts else None
        assert store.counts("pictures")["infra_error"] == 0
        # the chart reached the model as its data in words
        first = charts[0].turns[0].observation if charts[0].turns else ""
        assert "The chart's data" in first
