"""The report of a run with hundreds of domains: per-family and per-tier curves, trainer curves,
shares against quotas, the domains taken out of training, the domains that moved most (ranked by
their confidence intervals, 0 -> 0 left out), and a page that loads in headless Chromium."""

import base64
import io
import json
import os
import re
import shutil
import subprocess
from html.parser import HTMLParser

import pytest

from posttrain.evaluation import build_report
from posttrain.evaluation.movers import assured, rank_moves
from posttrain.evaluation.report_training import sections
from tests.breadth_run import build
from tests.test_eval_report import png_size

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.images: dict[str, str] = {}
        self.sections: list[str] = []
        self.tables = 0
        self.details: list[bool] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "img":
            self.images[a.get("alt", "")] = a.get("src", "")
        elif tag == "section":
            self.sections.append(a.get("id", ""))
        elif tag == "details":
            self.details.append("open" in a)


def test_moves_rank_by_the_change_the_interval_assures():
    rows = {"noisy": {"before": 0.0, "after": 0.5, "delta": 0.5, "ci": [-0.1, 0.9], "significant": False},
            "sure": {"before": 0.2, "after": 0.5, "delta": 0.3, "ci": [0.2, 0.4], "significant": True},
            "surer": {"before": 0.1, "after": 0.5, "delta": 0.4, "ci": [0.3, 0.5], "significant": True},
            "zero": {"before": 0.0, "after": 0.0, "delta": 0.0, "ci": [0.0, 0.0], "significant": False},
            "one": {"before": 1.0, "after": 1.0, "delta": 0.0, "ci": [-0.1, 0.1], "significant": False},
            "drop": {"before": 0.9, "after": 0.4, "delta": -0.5, "ci": [-0.7, -0.3], "significant": True}}
    moves = rank_moves(rows)
    # the noisy domain changed most, but its interval cannot rule out no change: it comes last
    assert [r["domain"] for r in moves.gains] == ["surer", "sure", "noisy"]
    assert [r["domain"] for r in moves.drops] == ["drop"] and moves.drops[0]["assured"] == pytest.approx(0.3)
    assert moves.unmoved == 2 and moves.significant == (2, 1)
    assert assured(0.1, -0.2, 0.3) == 0.0 and assured(-0.1, -0.3, -0.05) == 0.05


@pytest.mark.slow
def test_training_sections_with_tiers_quotas_and_retired_domains(tmp_path):
    info = build(tmp_path, n_domains=21, steps=20, checkpoint_every=5, tasks=2, samples=2)
    s = sections(tmp_path)
    learning, trainer, sched = s["learning"], s["trainer"], s["scheduler"]
    # binary rewards: the pass rate is the reward, drawn once and said so
    assert "figure" in learning and any("binary rewards" in n for n in learning["notes"])
    assert learning["tiers"] == ["background", "train"] and "tier_figure" in learning
    assert set(trainer["last"]) == {"loss", "kl", "grad_norm", "entropy"} and trainer["step"] == 20
    assert sched["snapshots"] == 4 and sched["domains"] == 21 and sched["share_by"] == "samples"
    step, mean_dev, worst = sched["deviation"]
    assert step == 20 and 0 <= mean_dev <= worst
    # the top table is ordered by how far a domain is from its quota
    gaps = [abs(share - quota) for _, _, quota, share, _, _ in sched["top"]]
    assert gaps == sorted(gaps, reverse=True) and len(sched["top"]) + len(sched["rest"]) == 21
    out = sched["out"]
    for kind in ("quarantined", "retired", "exhausted"):
        assert [r["domain"] for r in out[kind]] == sorted(info[kind]), kind
        assert all(r["since"] == 10 for r in out[kind])  # the first metrics line listing it
    assert "60%" in out["quarantined"][0]["why"] and "max_samples" in out["exhausted"][0]["why"]


def test_training_sections_without_scheduler_figures(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 0.3, "family/math/reward": 0.5,
                                                        "family/math/pass_rate": 0.25}) + "\n")
    s = sections(tmp_path)
    assert "note" in s["scheduler"] and s["scheduler"]["out"] == {"quarantined": [], "retired": [], "exhausted": []}
    assert s["trainer"]["missing"] == ["kl", "grad_norm", "entropy"]
    assert not any("binary" in n for n in s["learning"]["notes"])  # reward != pass rate: both drawn


def test_replay_drift_is_drawn_where_logged_and_never_missing(tmp_path):
    rows = [{"step": 1, "loss": 0.3, "kl": 0.01, "grad_norm": 1.0, "entropy": 0.9}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    plain = sections(tmp_path)["trainer"]
    assert plain["missing"] == [] and set(plain["last"]) == {"loss", "kl", "grad_norm", "entropy"}
    rows.append({**rows[0], "step": 2, "replay_drift": 0.04, "anchor_kl": 0.002})
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    replayed = sections(tmp_path)["trainer"]
    assert replayed["missing"] == [] and replayed["last"]["replay_drift"] == 0.04
    assert replayed["last"]["anchor_kl"] == 0.002


@pytest.fixture(scope="module")
def breadth(tmp_path_factory):
    run = tmp_path_factory.mktemp("breadth")
    info = build(run, n_domains=315)
    return run, build_report(run), info


@pytest.mark.slow
def test_report_of_315_domains_stays_readable(breadth):
    run, path, info = breadth
    page = path.read_text()
    parsed = _Page()
    parsed.feed(page)
    assert parsed.sections == ["run", "learning", "trainer", "scheduler", "evals", "ab", "forgetting", "noise",
                               "contamination"]
    assert set(parsed.images) == {"learning curves per family", "reward per tier", "trainer curves",
                                  "scheduler shares against quotas", "pass@1 per family", "largest gains",
                                  "largest drops", "cost against pass rate"}
    for src in parsed.images.values():
        w, h = png_size(src)
        assert 100 < w < 2000 and 100 < h < 2000  # no figure with a row per domain
    assert "315 domains: pass@1 per domain is in the collapsed table below, not drawn" in page
    # the movers: every domain that really moved, none of the 0 -> 0 ones
    moved = re.search(r"(\d+) domain\(s\) moved \((\d+) up, (\d+) down; .*?(\d+) did not move", page)
    assert moved, "movers summary missing"
    n, up, down, unmoved = map(int, moved.groups())
    assert n == up + down and n + unmoved == 315 and 0 < up <= len(info["gains"]) and 0 < down <= len(info["drops"])
    # long tables are folded: the per-domain ones are closed, short ones open
    assert parsed.details.count(False) >= 3
    for d in info["quarantined"] + info["retired"] + info["exhausted"]:
        assert d in page
    assert len(page) < 2_000_000


def _colours(png: bytes) -> int:
    from PIL import Image

    with Image.open(io.BytesIO(png)) as im:
        return len(im.convert("RGB").getcolors(maxcolors=1 << 20) or [])


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary on PATH (Debian: apt-get install chromium; "
                    "scripts/bootstrap.sh --test installs it)")
@pytest.mark.slow
def test_report_of_315_domains_renders_in_headless_chromium(breadth, tmp_path):
    _, path, _ = breadth
    probe = ("<script>window.addEventListener('load', () => { const p = document.createElement('pre');"
             " p.id = 'imgcheck'; p.textContent = JSON.stringify(Array.from(document.images).map("
             "i => [i.complete, i.naturalWidth])); document.body.appendChild(p); });</script>")
    probed = tmp_path / "probe.html"
    probed.write_text(path.read_text().replace("</body>", probe + "</body>"))
    base = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--hide-scrollbars", f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=10000"]
    env = {**os.environ, "HOME": str(tmp_path)}
    dom = subprocess.run([*base, "--dump-dom", probed.as_uri()], capture_output=True, text=True, timeout=180, env=env)
    assert dom.returncode == 0, dom.stderr[-2000:]
    parsed = _Page()
    parsed.feed(dom.stdout)
    assert {"learning", "trainer", "scheduler", "evals"} <= set(parsed.sections)
    found = re.search(r'<pre id="imgcheck">(.*?)</pre>', dom.stdout)
    assert found, dom.stdout[-2000:]
    images = json.loads(found.group(1))
    assert len(images) == 8 and all(ok and w > 0 for ok, w in images), images

    shot = tmp_path / "page.png"
    out = subprocess.run([*base, "--window-size=1200,4000", f"--screenshot={shot}", path.as_uri()],
                         capture_output=True, text=True, timeout=180, env=env)
    assert out.returncode == 0 and shot.is_file(), out.stderr[-2000:]
    raw = shot.read_bytes()
    assert png_size("data:image/png;base64," + base64.b64encode(raw).decode()) == (1200, 4000)
    # a loaded page: text, tables and charts in many colours, not one blank colour
    assert _colours(raw) > 50
