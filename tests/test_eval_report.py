"""The HTML report: self-contained, every figure decodes and loads (also in headless Chromium),
and sections without data say so."""

import base64
import json
import os
import re
import shutil
import struct
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
from typer.testing import CliRunner

from posttrain.cli import app as root_app
from posttrain.evaluation import (
    EvalConfig,
    build_report,
    check_contamination,
    compare,
    forgetting_report,
    guard_training,
    resolve_tasks,
    run_eval,
)
from posttrain.evaluation.forgetting import write_forgetting
from posttrain.evaluation.noise import NoiseReport, TaskNoise, update_quarantine, write_noise
from posttrain.storage.store import Store
from tests.test_eval_support import CoinPolicy

runner = CliRunner()
CHROMIUM = "/usr/bin/chromium"


class _Images(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.images: list[str] = []
        self.links: list[str] = []
        self.sections: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "img":
            self.images.append(a.get("src", ""))
        if tag in ("script", "link", "iframe") or (tag == "a" and "href" in a):
            self.links.append(a.get("src") or a.get("href") or tag)
        if tag == "section":
            self.sections.append(a.get("id", ""))


def png_size(data_uri: str) -> tuple[int, int]:
    assert data_uri.startswith("data:image/png;base64,")
    raw = base64.b64decode(data_uri.split(",", 1)[1], validate=True)
    assert raw[:8] == b"\x89PNG\r\n\x1a\n" and raw[12:16] == b"IHDR"
    return struct.unpack(">II", raw[16:24])


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("run")
    tasks = resolve_tasks("math.add.d2,math.sub.d2,text.upper.l3", per_domain=15)
    cfg = EvalConfig(k=(1, 4))
    with Store.for_run_dir(run) as store:
        store.put_policy_version("base", None, "ab" * 32, path=None)
        before = run_eval(CoinPolicy(0.5, "base"), tasks, cfg, name="base", store=store)
        after = run_eval(CoinPolicy({"math.add.d2": 0.9, "math.sub.d2": 0.5, "text.upper.l3": 0.2}, "round-1"),
                         tasks, cfg, name="round-1", store=store)
    before.save_to_run(run)
    after.save_to_run(run)
    compare(before, after).save_to_run(run)
    write_forgetting(run, forgetting_report(before, after, ["math.add.*"]), "round-1")
    noise = NoiseReport(k=3, max_flip_rate=0.0, tasks={"h1": TaskNoise("h1", "k1", "math.add.d2", 4, 1)})
    write_noise(run, noise)
    update_quarantine(run, noise)
    leaked = tasks[0][1]
    guard_training(check_contamination([leaked.model_copy(update={"split": "train"})], [leaked]), run, allow=True)
    with open(run / "metrics.jsonl", "w") as f:
        for step in range(20):
            f.write(json.dumps({"step": step, "family/math/reward": step / 20, "family/text/reward": 0.3,
                                "family/math/pass_rate": step / 25, "loss": 1.0}) + "\n")
        f.write("not json\n")
    return run


@pytest.fixture(scope="module")
def built(full_run):
    return build_report(full_run)


@pytest.mark.slow
def test_full_report_is_self_contained_and_every_figure_decodes(built):
    page = built.read_text()
    parsed = _Images()
    parsed.feed(page)
    # learning curves, trainer curves (loss), pass@1 per family, largest gains, largest drops,
    # pass@1 per domain, cost vs pass, A/B forest, forgetting forest
    assert len(parsed.images) == 9
    for src in parsed.images:
        w, h = png_size(src)
        assert w > 100 and h > 100
    assert parsed.links == []                      # nothing to fetch: no scripts, links or iframes
    assert parsed.sections == ["run", "learning", "trainer", "scheduler", "evals", "ab", "forgetting", "noise",
                               "contamination"]
    assert "1 unparseable line(s)" in page and "round-1 vs base" in page
    assert "significant drops: text.upper.l3" in page and "override recorded" in page
    assert "1 task(s) quarantined" in page and "math.sub.d2" in page


def test_empty_run_dir_gets_notes_instead_of_figures(tmp_path):
    page = build_report(tmp_path).read_text()
    parsed = _Images()
    parsed.feed(page)
    assert parsed.images == []
    for note in ("no metrics.jsonl", "no eval results", "no A/B reports", "no forgetting reports",
                 "no noise.json", "no contamination.json", "no store.sqlite"):
        assert note in page, note
    with pytest.raises(FileNotFoundError, match="no such run directory"):
        build_report(tmp_path / "missing")


def test_broken_files_are_reported_not_fatal(tmp_path):
    (tmp_path / "evals").mkdir()
    (tmp_path / "evals" / "bad.json").write_text('{"format": "posttrain.eval/1"}')
    (tmp_path / "metrics.jsonl").write_text('{"loss": 1}\n')
    page = build_report(tmp_path).read_text()
    assert "could not read" in page and "bad.json: missing field" in page
    assert "1 line(s) without an integer &#39;step&#39;" in page


@pytest.mark.slow
def test_cli_report(full_run, tmp_path):
    res = runner.invoke(root_app, ["report", str(full_run), "--out", str(tmp_path / "x.html")])
    assert res.exit_code == 0, res.output
    assert Path(res.output.strip()) == tmp_path / "x.html" and (tmp_path / "x.html").stat().st_size > 10_000


@pytest.mark.skipif(not os.access(CHROMIUM, os.X_OK), reason="Debian's chromium is not installed "
                    "(apt-get install chromium); the report's images are still checked by decoding them")
@pytest.mark.slow
def test_report_loads_in_headless_chromium(built, tmp_path):
    page = built.read_text()
    probe = ("<script>window.addEventListener('load', () => { const p = document.createElement('pre');"
             " p.id = 'imgcheck'; p.textContent = JSON.stringify(Array.from(document.images).map("
             "i => [i.complete, i.naturalWidth, i.naturalHeight])); document.body.appendChild(p); });</script>")
    probed = tmp_path / "probe.html"
    probed.write_text(page.replace("</body>", probe + "</body>"))
    profile = tmp_path / "profile"
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={profile}", "--virtual-time-budget=10000", "--dump-dom", probed.as_uri()]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "HOME": str(tmp_path)})
    assert out.returncode == 0, out.stderr[-2000:]
    found = re.search(r'<pre id="imgcheck">(.*?)</pre>', out.stdout)
    assert found, out.stdout[-2000:]
    images = json.loads(found.group(1))
    assert len(images) == 9 and all(ok and w > 0 and h > 0 for ok, w, h in images), images
    assert "posttrain report" in out.stdout
    shutil.rmtree(profile, ignore_errors=True)


def test_the_movers_compare_the_newest_evaluation_with_the_oldest_of_the_same_tasks(tmp_path):
    """A benchmark adds evaluations of more tasks to a finished run (before, after, then
    focus-before, focus-after): the movers compare focus-after with focus-before, not with the
    run's `before` (which shares a few of its tasks)."""
    import time

    few, many = resolve_tasks("math.add.d2", per_domain=3), resolve_tasks("math.add.d2", per_domain=12)
    cfg = EvalConfig(k=(1,))
    runs = [("before", few, 0.2), ("after", few, 0.3), ("focus-before", many, 0.5), ("focus-after", many, 0.9)]
    for name, tasks, p in runs:
        run_eval(CoinPolicy(p, name), tasks, cfg, name=name).save_to_run(tmp_path)
        time.sleep(0.01)  # created in this order
    page = build_report(tmp_path).read_text()
    assert "moved most: focus-before &rarr; focus-after" in page
    assert "moved most: before &rarr;" not in page

    (tmp_path / "evals" / "focus-before.json").unlink()  # no evaluation of the same tasks: the oldest
    assert "moved most: before &rarr; focus-after" in build_report(tmp_path).read_text()
