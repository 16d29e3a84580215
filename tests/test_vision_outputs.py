"""Where stored images go next: the Parquet export and the HTML report."""

from __future__ import annotations

import hashlib

import pytest

from posttrain.policies.scripted import ScriptedPolicy
from posttrain.scheduling.engine import run_episodes
from posttrain.storage.export import export_store
from posttrain.storage.store import Store
from posttrain.tasks.registry import get_domain


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    run = tmp_path_factory.mktemp("vision-run")
    chart, text = get_domain("docs.chart.rises.line"), get_domain("math.add.d1")
    items = [(chart, chart.task(0)), (chart, chart.task(0)), (text, text.task(0))]
    trajs = run_episodes(items, ScriptedPolicy.oracle(), workers=1)
    with Store.for_run_dir(run) as store:
        store.put_trajectories([(t, task, None) for t, (_, task) in zip(trajs, items)])
    return run


def test_parquet_rows_carry_their_images_and_hashes(run_dir, tmp_path):
    import pyarrow.parquet as pq

    with Store.for_run_dir(run_dir, readonly=True) as store:
        assert store.image_stats()["images"] == 1  # two episodes of one chart: one stored image
        export_store(store, tmp_path / "out.parquet", "parquet")
    rows = pq.read_table(tmp_path / "out.parquet").to_pylist()
    charts = [r for r in rows if r["domain"].startswith("docs.chart")]
    assert len(charts) == 2
    for r in charts:
        (image,) = r["images"]
        assert hashlib.sha256(image["data"]).hexdigest() == image["sha256"] == r["turn_images"][0][0]
        assert image["data"].startswith(b"\x89PNG") and image["mime"] == "image/png"
    (plain,) = [r for r in rows if r["domain"] == "math.add.d1"]
    assert plain["images"] == [] and plain["turn_images"] == [[]]


def test_report_shows_images_beside_the_turns(run_dir):
    from posttrain.evaluation.report import build_report

    page = build_report(run_dir).read_text()
    assert 'id="image-episodes"' in page
    assert page.count('src="data:image/png;base64,') == 2
    assert "docs.chart.rises.line" in page and "turn 0 observation" in page
