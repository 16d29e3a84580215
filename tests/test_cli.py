"""The root command mounts every sub-command it lists, or refuses to start."""

from __future__ import annotations

import pytest
import typer
from typer.testing import CliRunner

from posttrain.cli import _SUBCOMMANDS, _mount, app


def test_every_listed_sub_command_is_mounted():
    out = CliRunner().invoke(app, ["--help"], terminal_width=200).output
    for _, _, name in _SUBCOMMANDS:
        if " " not in name:
            assert name in out, f"{name} missing from:\n{out}"
    out = CliRunner().invoke(app, ["tasks", "--help"], terminal_width=200).output
    assert "contamination" in out and "noise" in out


@pytest.mark.parametrize("entry, message", [
    (("posttrain.rollout.clii", "rollout", "rollout"), "posttrain.rollout.clii"),
    (("posttrain.scheduling.cli", "rollot", "rollout"), "rollot"),
    (("posttrain.evaluation.cli", "noise", "taks noise"), "taks"),
])
def test_a_mistyped_entry_is_an_error_not_a_missing_command(entry, message):
    with pytest.raises((ImportError, AttributeError, ValueError), match=message):
        _mount(typer.Typer(), [("posttrain.tasks.cli", "app", "tasks"), entry])
