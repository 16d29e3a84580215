"""`posttrain sandbox check` and `posttrain sandbox run` (imports nothing heavy)."""

from __future__ import annotations

import signal as _signal
import sys
from typing import Any

import typer

app = typer.Typer(no_args_is_help=True, add_completion=False,
                  help="Sandboxes: which isolation layers are active here; run a command in one.")


@app.command()
def check() -> None:
    """Print each isolation layer and whether it is active on this machine.

    Exits non-zero (with the install command) when bubblewrap is missing or cannot run."""
    from posttrain.sandbox.bwrap import INSTALL_HINT, bwrap_problem, find_bwrap
    from posttrain.sandbox.layers import isolation_layers

    for layer in isolation_layers():
        mark = "on " if layer.active else "OFF"
        typer.echo(f"[{mark}] {layer.name:32s} {layer.detail}")
    problem = bwrap_problem()
    if problem is not None:
        typer.echo(f"\nThe default (bubblewrap) backend cannot run here: {problem}", err=True)
        if find_bwrap() is None:
            typer.echo(f"To fix: {INSTALL_HINT}", err=True)
        raise typer.Exit(1)
    typer.echo("\nThe bubblewrap backend is ready.")


@app.command(context_settings={"allow_interspersed_args": False})
def run(
    command: list[str] = typer.Argument(..., help="the command and its arguments (after --)"),
    timeout: float | None = typer.Option(None, "--timeout", help="wall-clock limit, seconds"),
    memory: int | None = typer.Option(None, "--memory", help="memory limit, MB"),
    allow_unsandboxed: bool = typer.Option(
        False, "--allow-unsandboxed", help="fall back to the unisolated process backend if "
        "bubblewrap is unavailable (trusted commands only)"),
) -> None:
    """Run one command in a fresh sandbox, with the workspace as its working directory.

    Prints its output and exits with its exit code; when a limit ended it, says which on
    stderr and exits non-zero (124 for the timeout, 128+N for a signal N, else 125)."""
    from posttrain.sandbox.base import Limits, SandboxError
    from posttrain.sandbox.factory import open_sandbox

    fields: dict[str, Any] = {}
    if timeout is not None:
        fields["wall_s"] = timeout
    if memory is not None:
        fields["memory_mb"] = memory
    try:
        limits = Limits(**fields)
    except ValueError as e:
        typer.echo(f"posttrain sandbox run: {e}", err=True)
        raise typer.Exit(2) from None
    try:
        with open_sandbox(limits, allow_unsandboxed=allow_unsandboxed) as sb:
            result = sb.run(list(command))
    except SandboxError as e:
        typer.echo(f"posttrain sandbox run: {e}", err=True)
        raise typer.Exit(3) from None
    sys.stdout.write(result.stdout)
    sys.stderr.write(result.stderr)
    if result.stdout_truncated or result.stderr_truncated:
        typer.echo(f"posttrain: output cut at {limits.output_bytes} bytes per stream", err=True)
    code = result.exit_code
    if result.limit is not None:
        how = ""
        if result.signal and result.limit.value not in ("timeout", "output"):
            how = f" ({_signal.Signals(result.signal).name})"
        typer.echo(f"posttrain: the {result.limit.value} limit ended the command{how}", err=True)
        if result.limit.value == "timeout":
            code = 124
        elif result.signal:
            code = 128 + result.signal
        else:
            code = 125
    elif code is None:
        code = 128 + (result.signal or 0) if result.signal else 125
    raise typer.Exit(code)
