"""`posttrain rollout`: scripted episodes into a store, a workload on the one episode engine."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import NoReturn

import typer

from posttrain.tasks.sources.cli import apply_sources, source_option


def _fail(message: str) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


def rollout(policy: str = typer.Option("oracle", "--policy",
                                       help="scripted policy: oracle, empty, or wrong"),
            domains: str = typer.Option(..., "--domains", help="glob(s), comma-separated, e.g. 'math.add.*'"),
            n: int = typer.Option(2, "--n", min=1, help="tasks per domain (seeds 0..N-1)"),
            run_dir: Path = typer.Option(..., "--run-dir", help="where the store is written"),
            split: str = typer.Option("train", "--split", help="train or eval"),
            workers: int = typer.Option(2, "--workers", min=1, help="environment steps in parallel"),
            max_infra_rate: float = typer.Option(0.05, "--max-infra-rate", min=0.0, max=1.0,
                                                 help="exit 3 when more episodes than this share are "
                                                      "infrastructure errors"),
            as_json: bool = typer.Option(False, "--json", help="print a JSON summary"),
            source: list[str] | None = source_option()) -> None:
    """Run episodes with a scripted policy over the matching domains and store them.
    Domains with no tasks in --split (an imported task folder lives in one) are skipped."""
    from posttrain import runlock
    from posttrain.errors import EXIT_UNTRUSTWORTHY
    from posttrain.policies.scripted import ScriptedPolicy
    from posttrain.scheduling.engine import WorkItem, run_workload
    from posttrain.storage.store import Store, StoreError
    from posttrain.tasks.domain import NoTasksInSplit
    from posttrain.tasks.registry import RegistryError, match_domains
    from posttrain.tasks.sources import absolute
    from posttrain.values.task import Split

    if split not in ("train", "eval"):
        _fail(f"--split must be 'train' or 'eval', got {split!r}")
    apply_sources(source)
    try:
        matched = match_domains(domains)
        scripted = ScriptedPolicy.named(policy)
    except (RegistryError, ValueError) as e:
        _fail(str(e))
    which: Split = "train" if split == "train" else "eval"
    specs, elsewhere = [], []
    for d in matched:
        try:
            specs += [WorkItem(d, d.task(seed, which)) for seed in range(n)]
        except NoTasksInSplit:  # an imported task folder lives in one split only
            elsewhere.append(d.name)
    if elsewhere:
        typer.echo(f"skipped {len(elsewhere)} domain(s) with no {split}-split tasks: "
                   f"{', '.join(elsewhere)}", err=True)
    if not specs:
        _fail(f"--domains {domains!r}: no matching domain has {split}-split tasks (try --split "
              f"{'eval' if split == 'train' else 'train'})")
    run_id = f"rollout-{uuid.uuid4().hex[:8]}"
    runlock.acquire(run_dir, "posttrain rollout")
    try:
        store = Store.for_run_dir(run_dir)
    except StoreError as e:
        _fail(str(e))
    store.start_run(run_id, {"kind": "rollout", "policy": policy, "domains": domains, "n": n,
                             "split": split, "sources": [absolute(s) for s in source or []]})
    with store:
        run_workload(specs, scripted, workers=workers, run_id=run_id,
                     on_result=lambda r: store.put_trajectory(r.trajectory, r.task, r.workspace_archive))
        counts = store.counts(run_id)
    if as_json:
        typer.echo(json.dumps(counts))
    else:
        typer.echo(f"run {run_id}: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    infra, episodes = counts.get("infra_error", 0), counts.get("episodes", 0)
    if episodes and infra / episodes > max_infra_rate:
        typer.echo(f"not trustworthy: {infra} of {episodes} episodes were infrastructure errors "
                   f"(threshold {100 * max_infra_rate:g}%, --max-infra-rate)", err=True)
        raise typer.Exit(EXIT_UNTRUSTWORTHY)
