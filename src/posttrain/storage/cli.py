"""`posttrain export DIR --format parquet|jsonl|verl|trl|sft [--passed-only] --out PATH`."""

from __future__ import annotations

from pathlib import Path
from typing import NoReturn

import typer


def export(run_dir: Path = typer.Argument(..., help="a run directory (holds store.sqlite)"),
           format: str = typer.Option("parquet", "--format",
                                      help="parquet or jsonl (posttrain's record); verl, trl or sft "
                                           "(other trainers' schemas, see posttrain.storage.formats)"),
           out: Path = typer.Option(..., "--out", help="file to write (.parquet; .jsonl for JSON lines "
                                                       "with verl/trl/sft)"),
           run_id: str = typer.Option(None, "--run-id", help="only this run's trajectories"),
           passed_only: bool = typer.Option(False, "--passed-only",
                                            help="trl/sft: only trajectories that passed (rejection "
                                                 "sampling)")) -> None:
    """Export a run's trajectories to Parquet or JSONL, or in verl's, TRL's or an SFT schema
    (written to a temporary file, then renamed into place: a failed export leaves no partial
    file)."""
    import os

    from posttrain.errors import is_disk_full, no_space
    from posttrain.storage.export import export_store
    from posttrain.storage.formats import FORMATS, export_for_trainer
    from posttrain.storage.store import STORE_FILE, Store, StoreError

    if format not in ("parquet", "jsonl", *FORMATS):
        _fail(f"--format must be one of parquet, jsonl, {', '.join(FORMATS)}; got {format!r}")
    if passed_only and format not in ("trl", "sft"):
        _fail("--passed-only goes with --format trl or sft")
    if not (run_dir / STORE_FILE).is_file():
        _fail(f"{run_dir}: not a run directory (no {STORE_FILE})")
    if out.is_dir() or not out.name:
        _fail(f"--out {str(out)!r}: is a directory; give a file name, e.g. {out / ('trajectories.' + format)}")
    if not out.parent.is_dir():
        _fail(f"--out {out}: the directory {out.parent} does not exist")
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    try:
        tmp.open("wb").close()  # can we write there at all? (say so in plain words, before the work)
        with Store.for_run_dir(run_dir, readonly=True) as store:
            runs = [r["id"] for r in store.runs()]
            if run_id is not None and run_id not in runs:
                _fail(f"--run-id {run_id!r}: no such run in {run_dir} (runs: {', '.join(runs) or 'none'})")
            if format in FORMATS:
                n = export_for_trainer(store, tmp, format, run_id=run_id, passed_only=passed_only,
                                       file_format="jsonl" if out.suffix == ".jsonl" else "parquet")
            else:
                n = export_store(store, tmp, format, run_id)
        os.replace(tmp, out)
    except (StoreError, ValueError) as e:
        _fail(str(e))
    except OSError as e:  # permission denied, a full disk, a read-only file system
        if is_disk_full(e, out.parent):  # the environment's refusal: one line, exit 1
            raise no_space(out, "exporting") from None
        _fail(f"--out {out}: cannot write: {e.strerror or e}")
    finally:
        tmp.unlink(missing_ok=True)
    typer.echo(f"wrote {n} {'rows' if format in FORMATS else 'trajectories'} to {out}")


def _fail(message: str) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)
