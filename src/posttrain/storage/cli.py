"""`posttrain export DIR --format parquet|jsonl --out PATH`."""

from __future__ import annotations

from pathlib import Path

import typer


def export(run_dir: Path = typer.Argument(..., help="a run directory (holds store.sqlite)"),
           format: str = typer.Option("parquet", "--format", help="parquet or jsonl"),
           out: Path = typer.Option(..., "--out", help="file to write"),
           run_id: str = typer.Option(None, "--run-id", help="only this run's trajectories")) -> None:
    """Export a run's trajectories to Parquet or JSONL."""
    from posttrain.storage.export import export_store
    from posttrain.storage.store import Store, StoreError

    try:
        with Store.for_run_dir(run_dir, readonly=True) as store:
            n = export_store(store, out, format, run_id)
    except (StoreError, ValueError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2)
    typer.echo(f"wrote {n} trajectories to {out}")
