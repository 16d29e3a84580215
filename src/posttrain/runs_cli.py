"""`posttrain runs [DIR]`: the run directories under DIR (default `runs`), with status, steps, key
figures and the command that resumes each stopped run (`posttrain.runs`)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import typer


def runs(parent: Path = typer.Argument(Path("runs"), help="the folder that holds run directories"),
         as_json: bool = typer.Option(False, "--json", help="print JSON")) -> None:
    """List runs: running (its lock is held), finished, failed or killed, with steps, figures and
    how to resume."""
    from posttrain.runs import list_runs

    found = list_runs(parent)
    if as_json:
        typer.echo(json.dumps({"runs": [r.to_dict() for r in found]}))
        return
    if not found:
        typer.echo(f"no runs in {parent}")
        return
    from rich.console import Console
    from rich.table import Table

    colour = {"running": "cyan", "finished": "green", "failed": "red", "killed": "yellow"}
    table = Table("run", "status", "steps", "figures", "updated", title=f"runs in {parent}")
    for r in found:
        steps = "-" if r.step is None else f"{r.step}/{r.steps if r.steps is not None else '?'}"
        figures = ", ".join(f"{k} {v:.3f}" for k, v in r.figures.items())
        ago = time.strftime("%Y-%m-%d %H:%M", time.localtime(r.updated))
        table.add_row(r.name, f"[{colour[r.status]}]{r.status}[/]" + (f" ({r.error[:60]})" if r.error else ""),
                      steps, figures or "-", ago)
    console = Console()
    console.print(table)
    for r in found:
        if r.resume:
            console.print(f"resume {r.name}: {r.resume}", highlight=False, soft_wrap=True)
