"""Where stored images go next: the Parquet export and the HTML report."""

from __future__ import annotations

import hashlib

import pytest

from posttrain.policies.scripted import ScriptedPolicy
from posttrain.scheduling.engine import run_episodes
from posttrain.storage.export import export_parquet, export_store, read_images
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


def test_parquet_rows_refer_to_their_images_written_once(run_dir, tmp_path):
    import pyarrow.parquet as pq

    with Store.for_run_dir(run_dir, readonly=True) as store:
        assert store.image_stats()["images"] == 1  # two episodes of one chart: one stored image
        export_store(store, tmp_path / "out.parquet", "parquet")
    rows = pq.read_table(tmp_path / "out.parquet").to_pylist()
    charts = [r for r in rows if r["domain"].startswith("docs.chart")]
    assert len(charts) == 2 and charts[0]["turn_images"] == charts[1]["turn_images"]
    assert sum(len(r["images"]) for r in rows) == 1  # the chart both rows show, written once
    images = read_images(tmp_path / "out.parquet")
    for r in charts:
        image = images[r["turn_images"][0][0]]
        assert hashlib.sha256(image.data).hexdigest() == image.sha256
        assert image.data.startswith(b"\x89PNG") and image.mime == "image/png"
    (plain,) = [r for r in rows if r["domain"] == "math.add.d1"]
    assert plain["images"] == [] and plain["turn_images"] == [[]]


def test_parquet_export_writes_each_image_once_however_often_it_recurs(tmp_path):
    import pyarrow.parquet as pq

    chart = get_domain("docs.chart.peak.bar")
    items = [(chart, chart.task(0))] * 4 + [(chart, chart.task(1))] * 2  # two GRPO groups
    trajs = run_episodes(items, ScriptedPolicy.oracle(), workers=1)
    distinct = {img.sha256: img for t in trajs for img in t.images.values()}
    assert len(distinct) == 2
    assert export_parquet(trajs, tmp_path / "g.parquet") == 6
    rows = pq.read_table(tmp_path / "g.parquet").to_pylist()
    written = [img for r in rows for img in r["images"]]
    assert len(written) == 2  # not 6: one entry per hash
    assert sum(len(img["data"]) for img in written) == sum(len(i.data) for i in distinct.values())
    assert [len(r["images"]) for r in rows] == [1, 0, 0, 0, 1, 0]  # on the first row that shows it
    images = read_images(tmp_path / "g.parquet")
    assert set(images) == set(distinct)
    assert all(images[sha].data == distinct[sha].data for r in rows for turn in r["turn_images"] for sha in turn)


def test_report_shows_images_beside_the_turns(run_dir):
    from posttrain.evaluation.report import build_report

    page = build_report(run_dir).read_text()
    assert 'id="image-episodes"' in page
    assert page.count('src="data:image/png;base64,') == 2
    assert "docs.chart.rises.line" in page and "turn 0 observation" in page
