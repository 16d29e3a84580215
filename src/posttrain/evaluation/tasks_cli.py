"""`posttrain tasks contamination` and `posttrain tasks noise`: the evaluation layer's checks of a
task set (train/eval overlap) and of a verifier (flips on re-verification). Thin, as `cli`."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from posttrain.cli_params import share
from posttrain.evaluation.cli import DEFAULT_TASKS, fail
from posttrain.evaluation.tasksets import is_task_file


def contamination(train: str = typer.Option(DEFAULT_TASKS, "--train", help="training tasks: domain globs "
                                            "(train split) or a task file"),
                  eval_: str | None = typer.Option(None, "--eval", help="eval tasks: domain globs (eval "
                                                      "split) or a task file; default: the --train globs"),
                  train_n: int = typer.Option(50, "--train-n", min=1, help="train tasks per domain (globs)"),
                  eval_n: int = typer.Option(20, "--eval-n", min=1, help="eval tasks per domain (globs)"),
                  threshold: float = typer.Option(0.8, "--threshold", callback=share,
                                                  help="Jaccard similarity of a near-duplicate"),
                  run_dir: Path | None = typer.Option(None, "--run-dir", help="record RUN/contamination.json"),
                  as_json: bool = typer.Option(False, "--json")) -> None:
    """Find exact and near-duplicate overlap between training and evaluation tasks (exit 1 if any)."""
    from posttrain.evaluation.contamination import ContaminationConfig, check_contamination
    from posttrain.evaluation.tasksets import TaskSetError, load_task_file, tasks_from_domains

    def load(spec: str, n: int, split: str):
        if not is_task_file(spec) and (Path(spec).suffix in (".toml", ".json", ".jsonl") or "/" in spec):
            fail(f"--{split}: {spec}: no such task file (and not a domain glob)")
        try:
            return load_task_file(spec) if is_task_file(spec) else tasks_from_domains(spec, n, split)  # type: ignore[arg-type]
        except (TaskSetError, OSError) as e:
            fail(f"--{split}: {e}")

    try:
        cfg = ContaminationConfig(threshold=threshold)
    except ValueError as e:
        fail(str(e))
    rep = check_contamination(load(train, train_n, "train"), load(eval_ or train, eval_n, "eval"), config=cfg)
    if run_dir is not None:
        run_dir.mkdir(parents=True, exist_ok=True)
        from posttrain.errors import write_text_atomic

        write_text_atomic(run_dir / "contamination.json",
                          json.dumps({"overridden": False, "refused": False, **rep.to_dict()}, indent=1),
                          "the contamination check")
    body = rep.to_dict()
    if as_json:
        typer.echo(json.dumps(body))
    else:
        typer.echo(f"{rep.n_eval} eval tasks vs {rep.n_train} training tasks in {rep.seconds:.1f}s: "
                   f"{body['exact']} exact, {body['near']} near-duplicate matches, "
                   f"{body['leaked_eval_tasks']} eval task(s) leak")
        for m in rep.matches[:50]:
            typer.echo(f"  {m.kind:5} {m.field:9} {m.similarity:.2f}  {m.eval_key}  ~  {m.train_key}")
        if len(rep.matches) > 50:
            typer.echo(f"  ... and {len(rep.matches) - 50} more (use --json)")
    raise typer.Exit(0 if rep.ok else 1)


def noise(run_dir: Path = typer.Argument(..., help="a run directory with a store"),
          k: int = typer.Option(3, "--k", min=1, help="re-verifications per stored outcome"),
          domains: str | None = typer.Option(None, "--domains", help="only these domain globs"),
          run_id: str | None = typer.Option(None, "--run-id", help="only this run id of the store"),
          max_flip_rate: float = typer.Option(0.0, "--max-flip-rate", callback=share,
                                              help="a task above this flip share is quarantined"),
          as_json: bool = typer.Option(False, "--json")) -> None:
    """Re-verify stored outcomes k times, report flip rates per domain, quarantine noisy tasks
    (RUN/quarantine.json, read by training through posttrain.evaluation.load_quarantine)."""
    from posttrain.evaluation.noise import measure_noise, update_quarantine, write_noise
    from posttrain.storage.store import Store, StoreError

    try:
        store = Store.for_run_dir(run_dir, readonly=False) if (run_dir / "store.sqlite").is_file() else None
    except StoreError as e:
        fail(str(e))
    if store is None:
        fail(f"{run_dir}: no store.sqlite (nothing stored to re-verify)")
    try:
        with store:
            rep = measure_noise(store, k=k, domains=domains, run_id=run_id, max_flip_rate=max_flip_rate)
    except ValueError as e:
        fail(str(e))
    write_noise(run_dir, rep)
    qpath = update_quarantine(run_dir, rep)
    body = rep.to_dict()
    if as_json:
        typer.echo(json.dumps({**body, "quarantine": str(qpath)}))
        return
    for d, v in body["domains"].items():
        rate = "–" if v["flip_rate"] is None else f"{100 * v['flip_rate']:.1f}%"
        typer.echo(f"{d:32} {v['trajectories']:6} trajectories  flip rate {rate:>6}  noisy tasks "
                   f"{v['noisy_tasks']}  infra errors {v['infra_errors']}")
    typer.echo(f"{body['trajectories']} trajectories re-verified {k}x in {body['seconds']:.1f}s; "
               f"{len(body['noisy_tasks'])} noisy task(s) quarantined in {qpath}")
