"""`posttrain run [CONFIG.toml]`: the main job (see `posttrain.pipeline.main`)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import typer


def _interrupted(run_dir) -> None:
    """Ctrl-C: say what is kept and how to go on (everything up to the last checkpoint is)."""
    import shlex

    latest = run_dir / "checkpoints" / "latest.json"
    args = [a for a in sys.argv[1:] if a != "--resume"] + ["--resume"]
    where = (f"the last checkpoint is step {json.loads(latest.read_text())['step']}" if latest.exists()
             else "no checkpoint was written yet")
    typer.echo(f"\ninterrupted: {where} ({run_dir}); continue with: posttrain "
               f"{' '.join(map(shlex.quote, args))}", err=True)


def run(config: Path = typer.Argument(None, help="a TOML config (default: the embedded default job)"),
        name: str = typer.Option(None, "--name", help="run name (directory runs/NAME)"),
        steps: int = typer.Option(None, "--steps", min=0, help="trainer steps (overrides the config)"),
        model: str = typer.Option(None, "--model", help="starting model dir or checkpoint (e.g. a "
                                                        "previous round's runs/X/checkpoints/step-N)"),
        resume: bool = typer.Option(False, "--resume", help="continue a killed run from its last checkpoint"),
        as_json: bool = typer.Option(False, "--json", help="print the summary as one JSON line at the end")) -> None:
    """Post-train a model with GRPO: evaluate, train on the scheduler, evaluate again."""
    from posttrain.evaluation.contamination import ContaminationError
    from posttrain.pipeline.config import ConfigError, load_config
    from posttrain.pipeline.main import Job
    from posttrain.tasks.registry import RegistryError

    overrides = {k: v for k, v in (("name", name), ("steps", steps), ("model.path", model)) if v is not None}
    cfg = None
    try:
        cfg = load_config(config, overrides)
        run_dir = cfg.run_dir
        # a run exists once it has recorded something (its store); a run refused before its
        # first episode (contamination, a config the model cannot serve) may be started again
        started = (run_dir / "store.sqlite").exists() or (run_dir / "checkpoints").exists()
        if started and not resume:
            raise ConfigError(f"{run_dir} already holds a run: pass --resume to continue it, or "
                              "--name NEW for a new run")
        if resume and not started:
            raise ConfigError(f"--resume: {run_dir} holds no run to resume")
        job = Job(cfg)
        summary = job.run()
    except (ConfigError, RegistryError, ContaminationError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2)
    except KeyboardInterrupt:
        if cfg is not None:
            _interrupted(cfg.run_dir)
        # Leave now, without the interpreter's shutdown: a worker thread may be inside a torch
        # call, and finalizing under it aborts the process ("terminate called without an active
        # exception"). Nothing is lost: store transactions and checkpoints are atomic, and each
        # sandbox's supervisor kills its sandbox when our end of its socket closes.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(130)
    if as_json:
        typer.echo(json.dumps(summary))
