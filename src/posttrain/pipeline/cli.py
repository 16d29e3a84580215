"""`posttrain run [CONFIG.toml]`: the main job (see `posttrain.pipeline.main`)."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path

import typer

from posttrain.cli_params import share


def _interrupted(run_dir) -> None:
    """Ctrl-C: say what is kept and how to go on (everything up to the last checkpoint is)."""
    import shlex

    latest = run_dir / "checkpoints" / "latest.json"
    args = [a for a in sys.argv[1:] if a != "--resume"] + ["--resume"]
    where = (f"the last checkpoint is step {json.loads(latest.read_text())['step']}" if latest.exists()
             else "no checkpoint was written yet")
    typer.echo(f"\ninterrupted: {where} ({run_dir}); continue with: posttrain "
               f"{' '.join(map(shlex.quote, args))}", err=True)


def _check_model(cfg, field: str) -> None:
    """The starting model exists and its device is there, before anything is written."""
    from posttrain.errors import UserError

    path = Path(cfg.model.path)
    if not path.is_dir():
        raise UserError("no such model directory" if not path.exists() else "not a directory",
                        field=field, path=path)
    if not (path / "config.json").is_file():
        raise UserError("not a Hugging Face model directory or posttrain checkpoint (no config.json)",
                        field=field, path=path)
    device = cfg.model.device
    if device.split(":")[0] == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise UserError(f"{device!r} asked for, but this torch build ({torch.__version__}) has no "
                            "CUDA device; use device = \"cpu\"", field="model.device")
        index = int(device.split(":")[1]) if ":" in device and device.split(":")[1].isdigit() else 0
        if index >= torch.cuda.device_count():
            raise UserError(f"{device!r}: there are {torch.cuda.device_count()} CUDA device(s)",
                            field="model.device")
    elif device not in ("cpu", "mps"):
        raise UserError(f"unknown device {device!r} (cpu, cuda or cuda:N)", field="model.device")


def run(config: Path = typer.Argument(None, help="a TOML config (default: the embedded default job)"),
        name: str = typer.Option(None, "--name", help="run name (directory runs/NAME)"),
        steps: int = typer.Option(None, "--steps", min=0, help="trainer steps (overrides the config)"),
        model: str = typer.Option(None, "--model", help="starting model dir or checkpoint (e.g. a "
                                                        "previous round's runs/X/checkpoints/step-N)"),
        resume: bool = typer.Option(False, "--resume", help="continue a killed run from its last checkpoint"),
        skip_unfit: bool = typer.Option(False, "--skip-unfit", help="leave out the domains whose prompts do "
                                                                    "not fit the model's context (named once), "
                                                                    "instead of refusing to start"),
        max_infra_rate: float = typer.Option(0.05, "--max-infra-rate", callback=share,
                                             help="exit 3 when the before/after evaluation has more "
                                                  "infrastructure errors than this share (or a domain "
                                                  "has nothing else)"),
        sets: list[str] = typer.Option(None, "--set", metavar="KEY=VALUE",
                                       help="override a config field (repeatable): a TOML dotted key and "
                                            "value, e.g. --set trainer.replay_solved=4 --set "
                                            "'scheduler.domains.\"code.*\".weight=2'; the flags above win"),
        as_json: bool = typer.Option(False, "--json", help="print the summary as one JSON line at the end")) -> None:
    """Post-train a model with GRPO: evaluate, train on the scheduler, evaluate again.

    Exit codes: 0 done; 1 a significant regression against `[eval] baseline`; 2 bad config or
    input; 3 the result is not what was asked: training stopped before its last step (every
    domain quarantined or retired, the policy backend down), or an evaluation is not trustworthy
    (infrastructure errors, see --max-infra-rate); 130 interrupted."""
    from posttrain.training.engines import ranks

    if ranks.is_follower():  # under torchrun: rank 0 runs the job, this rank trains its shard
        from posttrain.training.follow import follow

        follow()
        return
    from posttrain import runlock, runs
    from posttrain.errors import EXIT_BAD_INPUT, EXIT_UNTRUSTWORTHY, UserError
    from posttrain.evaluation.contamination import ContaminationError
    from posttrain.pipeline.config import ConfigError, check_resume, dotted, load_config, parse_set, run_started
    from posttrain.pipeline.main import Job
    from posttrain.policies.base import PolicyError
    from posttrain.storage.store import StoreError
    from posttrain.tasks.registry import RegistryError
    from posttrain.training.trainer import NonFiniteUpdates

    flags = dotted({k: v for k, v in (("name", name), ("steps", steps), ("model.path", model),
                                      ("domains.skip_unfit", skip_unfit or None)) if v is not None})
    source = str(config) if config is not None else "<default config>"
    cfg = None
    created: Path | None = None
    job_started = False
    try:
        cfg = load_config(config, {**parse_set(sets or []), **flags})
        run_dir = cfg.run_dir
        try:
            _check_model(cfg, "--model" if model is not None else "model.path")
        except UserError as e:
            raise ConfigError(e.line() if e.field == "--model" else f"{source}: {e.line()}") from None
        # the outermost folder this invocation creates (runs/ itself on a first run), or None
        created = next((p for p in reversed([run_dir.absolute(), *run_dir.absolute().parents])
                        if not p.exists()), None)
        runlock.acquire(run_dir, "posttrain run")  # before the check: two runs cannot both pass it
        started = run_started(run_dir)
        if started and not resume:
            raise ConfigError(f"{run_dir} already holds a run: pass --resume to continue it, or "
                              "--name NEW for a new run")
        if resume and not started:
            raise ConfigError(f"--resume: {run_dir} holds no run to resume")
        check_resume(cfg)  # also in the job; here it refuses before the run is marked failed
        (run_dir / runs.STATUS_FILE).unlink(missing_ok=True)  # a resumed run is not failed any more
        job_started = True
        job = Job(cfg, max_infra_rate=max_infra_rate)
        summary = job.run()
    except (ConfigError, RegistryError, ContaminationError, PolicyError, UserError) as e:
        if created and cfg is not None and not isinstance(e, ContaminationError):
            _forget(cfg.run_dir, created)
        if job_started and cfg is not None:
            runs.mark(cfg.run_dir, "failed", str(e))  # for `posttrain runs` (kept only if the dir is)
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(EXIT_BAD_INPUT) from None
    except NonFiniteUpdates as e:  # the training stopped before its last step: exit 3, one line
        if cfg is not None:
            runs.mark(cfg.run_dir, "failed", str(e))
        typer.echo(f"error: the training diverged: {e}", err=True)
        raise typer.Exit(EXIT_UNTRUSTWORTHY) from None
    except StoreError as e:  # a full disk, a store another process holds, a corrupt file
        if job_started and cfg is not None:
            runs.mark(cfg.run_dir, "failed", str(e))
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from None
    except OSError as e:  # the environment refused (a full disk): run_cli says it in one line, exit 1
        if job_started and cfg is not None:
            with contextlib.suppress(OSError):  # the disk may be too full for this too
                runs.mark(cfg.run_dir, "failed", str(e))
        raise
    except KeyboardInterrupt:
        if job_started and cfg is not None:
            runs.mark(cfg.run_dir, "interrupted")
            _interrupted(cfg.run_dir)
        # Leave now, without the interpreter's shutdown: a worker thread may be inside a torch
        # call, and finalizing under it aborts the process ("terminate called without an active
        # exception"). Nothing is lost: store transactions and checkpoints are atomic, and each
        # sandbox's supervisor kills its sandbox when our end of its socket closes.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(130)
    reasons = summary["untrustworthy"]
    if as_json:
        typer.echo(json.dumps(summary))
    if reasons:
        typer.echo("not trustworthy:\n  " + "\n  ".join(reasons), err=True)
        raise typer.Exit(EXIT_UNTRUSTWORTHY)
    if summary.get("gate") and not summary["gate"]["passed"]:  # [eval] baseline: a regression
        typer.echo(f"error: significant regression against {summary['gate']['baseline']}: "
                   f"{', '.join(summary['gate']['regressions'])}", err=True)
        raise typer.Exit(1)


def _forget(run_dir: Path, created: Path) -> None:
    """Remove a run directory this invocation created and that holds no recorded run (a model
    that would not load leaves no `config.json` behind to confuse the next attempt), and the
    folders above it up to `created` that it created too, where they are empty."""
    import shutil

    from posttrain import runlock
    from posttrain.pipeline.config import run_started

    if not run_started(run_dir):
        runlock.release(run_dir)
        shutil.rmtree(run_dir, ignore_errors=True)
        for parent in run_dir.absolute().parents:
            if not parent.is_relative_to(created):
                break
            try:
                parent.rmdir()  # only if empty: another run may have started there meanwhile
            except OSError:
                break
