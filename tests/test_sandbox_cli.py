"""`posttrain sandbox check` and `posttrain sandbox run`."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from posttrain.sandbox import bwrap
from posttrain.sandbox.cli import app

PROBLEM = bwrap.bwrap_problem()
needs_bwrap = pytest.mark.skipif(PROBLEM is not None, reason=f"bubblewrap unavailable: {PROBLEM}")
runner = CliRunner()


@needs_bwrap
def test_check_lists_layers():
    r = runner.invoke(app, ["check"])
    assert r.exit_code == 0, r.output
    assert "[on ] bubblewrap" in r.output and "seccomp" in r.output and "rlimits" in r.output


def test_check_fails_with_install_command_without_bwrap(monkeypatch):
    monkeypatch.setattr(bwrap, "find_bwrap", lambda: None)
    bwrap.bwrap_problem.cache_clear()
    try:
        r = runner.invoke(app, ["check"])
    finally:
        bwrap.bwrap_problem.cache_clear()
    assert r.exit_code == 1
    assert "apt-get install bubblewrap" in r.output
    assert "[OFF] bubblewrap" in r.output


@needs_bwrap
def test_run_prints_output_and_exit_code():
    r = runner.invoke(app, ["run", "--", "python3", "-c",
                            "import os; print(os.getcwd()); raise SystemExit(3)"])
    assert r.exit_code == 3 and r.stdout == "/ws\n"


@needs_bwrap
def test_run_reports_the_limit():
    r = runner.invoke(app, ["run", "--timeout", "0.5", "--", "sleep", "10"])
    assert r.exit_code == 124 and "timeout limit ended the command" in r.stderr
    r = runner.invoke(app, ["run", "--memory", "64", "--", "python3", "-c",
                            "b = [b'x' * (8 << 20) for _ in range(100)]"])
    assert r.exit_code != 0 and "memory limit" in r.stderr


def test_run_rejects_bad_limits():
    r = runner.invoke(app, ["run", "--memory", "0", "--", "true"])
    assert r.exit_code == 2 and "memory_mb" in r.stderr
