"""`posttrain rollout` (scripted episodes into a store) and `posttrain replay`."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import typer


def _fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


def rollout(policy: str = typer.Option("oracle", "--policy",
                                       help="scripted policy: oracle, empty, or wrong"),
            domains: str = typer.Option(..., "--domains", help="glob(s), comma-separated, e.g. 'math.add.*'"),
            n: int = typer.Option(2, "--n", min=1, help="tasks per domain (seeds 0..N-1)"),
            run_dir: Path = typer.Option(..., "--run-dir", help="where the store is written"),
            split: str = typer.Option("train", "--split", help="train or eval"),
            workers: int = typer.Option(2, "--workers", min=1, help="environment steps in parallel"),
            as_json: bool = typer.Option(False, "--json", help="print a JSON summary")) -> None:
    """Run episodes with a scripted policy over the matching domains and store them."""
    from posttrain.policies.scripted import ScriptedPolicy
    from posttrain.scheduling.engine import WorkItem, run_workload
    from posttrain.storage.store import Store, StoreError
    from posttrain.tasks.registry import RegistryError, match_domains

    if split not in ("train", "eval"):
        _fail(f"--split must be 'train' or 'eval', got {split!r}")
    try:
        matched = match_domains(domains)
    except RegistryError as e:
        _fail(str(e))
    scripted = ScriptedPolicy.named(policy)
    run_id = f"rollout-{uuid.uuid4().hex[:8]}"
    items = [WorkItem(d, d.task(seed, split)) for d in matched for seed in range(n)]
    try:
        store = Store.for_run_dir(run_dir)
    except StoreError as e:
        _fail(str(e))
    store.start_run(run_id, {"kind": "rollout", "policy": policy, "domains": domains, "n": n,
                             "split": split})
    with store:
        run_workload(items, scripted, workers=workers, run_id=run_id,
                     on_result=lambda r: store.put_trajectory(r.trajectory, r.task, r.workspace_archive))
        counts = store.counts(run_id)
    if as_json:
        typer.echo(json.dumps(counts))
    else:
        typer.echo(f"run {run_id}: " + ", ".join(f"{k} {v}" for k, v in counts.items()))


def replay(run_dir: Path = typer.Argument(..., help="a run directory"),
           trajectory_id: str = typer.Argument(None, help="a trajectory id (or unique prefix)"),
           all_: bool = typer.Option(False, "--all", help="every trajectory of the store"),
           rescore: bool = typer.Option(False, "--rescore",
                                        help="re-verify the stored outcome with the current verifier"),
           as_json: bool = typer.Option(False, "--json", help="print a JSON summary")) -> None:
    """Re-run stored trajectories in fresh sandboxes (or re-score them) and compare."""
    from posttrain.rollout import replay as rp
    from posttrain.sandbox import SandboxPool
    from posttrain.storage.store import Store, StoreError

    if bool(trajectory_id) == all_:
        _fail("give exactly one of TRAJECTORY_ID or --all")
    try:
        store = Store.for_run_dir(run_dir)
        trajs = list(store.trajectories()) if all_ else [store.get_trajectory(trajectory_id)]
    except (StoreError, KeyError) as e:
        _fail(str(e).strip("'\""))
    results = []
    with store, SandboxPool(size=1) as pool:
        for t in trajs:
            if rescore:
                results.append(rp.rescore(store, t, sandbox_factory=pool.sandbox))
            else:
                results.append(rp.replay(store, t, sandbox_factory=pool.sandbox))
    matched = sum(r.matched for r in results)
    diverged = [r.to_dict() for r in results if not r.matched]
    if as_json:
        typer.echo(json.dumps({"replayed": len(results), "matched": matched, "diverged": diverged}))
    else:
        typer.echo(f"{'rescored' if rescore else 'replayed'} {len(results)}, matched {matched}")
        for d in diverged:
            div = d["divergence"] or {}
            typer.echo(f"  {d['trajectory_id']}: diverges at turn {div.get('turn')} ({div.get('field')})")
    if diverged:
        raise typer.Exit(1)
