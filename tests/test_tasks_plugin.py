"""Third-party families load through the `posttrain.families` entry point group."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from posttrain.cli import app as root_app
from posttrain.scheduling.domain_check import check_domains
from posttrain.tasks import registry

PLUGIN_ROOT = Path(__file__).parent / "plugin_family"


def _install(tmp_path: Path, monkeypatch, entry: str, name: str = "posttrain_demo_family") -> None:
    """What `pip install tests/plugin_family` would leave: the package importable and a
    dist-info declaring its entry point, both on sys.path."""
    dist = tmp_path / f"{name}-0.1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1.0\n")
    (dist / "entry_points.txt").write_text(f"[posttrain.families]\n{entry}\n")
    monkeypatch.syspath_prepend(str(PLUGIN_ROOT))
    monkeypatch.syspath_prepend(str(tmp_path))
    # Only one built-in family: this test is about plugins, not about the others' modules.
    monkeypatch.setattr(registry, "BUILTIN_FAMILY_MODULES", ("posttrain.tasks.families.text",))
    registry.reset_cache()


@pytest.fixture(autouse=True)
def _fresh_registry():
    registry.reset_cache()
    yield
    registry.reset_cache()
    sys.modules.pop("posttrain_demo_family", None)


def test_plugin_domains_are_registered_and_listed(tmp_path, monkeypatch):
    _install(tmp_path, monkeypatch, "demo = posttrain_demo_family:domains")
    domains = registry.all_domains()
    assert {"demo.repeat.n2", "demo.repeat.n3"} <= set(domains) and "text.sort.l3" in domains
    assert registry.families()["demo"][0].name == "demo.repeat.n2"
    report = check_domains(registry.match_domains("demo.*"), per_domain=3)
    assert report.ok and report.tasks == 6

    result = CliRunner().invoke(root_app, ["tasks", "list", "--json"])
    assert result.exit_code == 0, result.output
    rows = {r["name"]: r for r in json.loads(result.output)["domains"]}
    assert rows["demo.repeat.n3"] == {"name": "demo.repeat.n3", "family": "demo", "env": "single",
                                      "verifier": "exact@1"}
    shown = CliRunner().invoke(root_app, ["tasks", "show", "demo.repeat.n2", "--seed", "1"])
    assert shown.exit_code == 0 and "repeat " in shown.output


def test_a_broken_plugin_names_itself_and_is_skipped(tmp_path, monkeypatch, caplog):
    _install(tmp_path, monkeypatch, "broken = posttrain_demo_family:no_such_function")
    assert "text.sort.l3" in registry.all_domains()  # the others still load
    [b] = registry.broken().values()
    assert "plugin 'broken' (posttrain_demo_family:no_such_function)" in b.error
    assert "skipped plugin broken" in caplog.text


def test_a_plugin_cannot_take_a_builtin_name(tmp_path, monkeypatch):
    (tmp_path / "clash_family.py").write_text(
        "from posttrain.tasks.families import text\n"
        "def domains():\n    return text.domains()[:1]\n")
    _install(tmp_path, monkeypatch, "clash = clash_family:domains", name="clash_family")
    with pytest.raises(registry.RegistryError, match=r"registered twice .*plugin clash"):
        registry.all_domains()
    sys.modules.pop("clash_family", None)
