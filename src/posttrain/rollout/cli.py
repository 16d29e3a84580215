"""`posttrain rollout` (scripted episodes into a store) and `posttrain replay`."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import NoReturn, Optional

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
            source: Optional[list[str]] = source_option()) -> None:
    """Run episodes with a scripted policy over the matching domains and store them.
    Domains with no tasks in --split (an imported task folder lives in one) are skipped."""
    from posttrain import runlock
    from posttrain.errors import EXIT_UNTRUSTWORTHY
    from posttrain.envs import EnvConfig, sandbox_preload
    from posttrain.policies.scripted import ScriptedPolicy
    from posttrain.rollout.runner import EpisodeSpec, run_episodes
    from posttrain.sandbox import SandboxPool
    from posttrain.storage.store import Store, StoreError
    from posttrain.tasks.domain import NoTasksInSplit
    from posttrain.tasks.registry import RegistryError, match_domains
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
            specs += [EpisodeSpec(d, d.task(seed, which)) for seed in range(n)]
        except NoTasksInSplit:  # an imported task folder lives in one split only
            elsewhere.append(d.name)
    if elsewhere:
        typer.echo(f"skipped {len(elsewhere)} domain(s) with no {split}-split tasks: "
                   f"{', '.join(elsewhere)}", err=True)
    if not specs:
        _fail(f"--domains {domains!r}: no matching domain has {split}-split tasks (try --split "
              f"{'eval' if split == 'train' else 'train'})")
    matched = [d for d in matched if d.name not in elsewhere]
    run_id = f"rollout-{uuid.uuid4().hex[:8]}"
    runlock.acquire(run_dir, "posttrain rollout")
    try:
        store = Store.for_run_dir(run_dir)
    except StoreError as e:
        _fail(str(e))
    store.start_run(run_id, {"kind": "rollout", "policy": policy, "domains": domains, "n": n,
                             "split": split, "sources": source or []})
    tasks = {(s.domain.name, s.task.key): s.task for s in specs}
    with store, SandboxPool(size=workers, preload=sandbox_preload(matched)) as pool:
        def save(ep) -> None:
            store.put_trajectory(ep.result(), tasks[(ep.domain.name, ep.task.key)], ep.workspace_archive)

        run_episodes(specs, scripted, env_config=EnvConfig(), sandbox_factory=pool.sandbox,
                     workers=workers, run_id=run_id, on_done=save)
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


def replay(run_dir: Path = typer.Argument(..., help="a run directory"),
           trajectory_id: str = typer.Argument(None, help="a trajectory id (or unique prefix)"),
           all_: bool = typer.Option(False, "--all", help="every trajectory of the store"),
           rescore: bool = typer.Option(False, "--rescore",
                                        help="re-verify the stored outcome with the current verifier"),
           as_json: bool = typer.Option(False, "--json", help="print a JSON summary")) -> None:
    """Re-run stored trajectories in fresh sandboxes (or re-score them) and compare."""
    from posttrain.rollout import replay as rp
    from posttrain.sandbox import SandboxPool
    from posttrain.storage.store import STORE_FILE, Store, StoreError

    if bool(trajectory_id) == all_:
        _fail("give exactly one of TRAJECTORY_ID or --all")
    # replay reads a run; it must never create one (a mistyped directory would become a run)
    if run_dir.is_file():
        _fail(f"{run_dir}: is a file; give the run directory that holds {STORE_FILE}")
    if not (run_dir / STORE_FILE).is_file():
        _fail(f"{run_dir}: not a run directory (no {STORE_FILE}"
              + (")" if run_dir.is_dir() else "; no such directory)"))
    try:
        store = Store.for_run_dir(run_dir, readonly=not rescore)  # only a re-score writes (its verdicts)
        trajs = list(store.trajectories()) if all_ else [store.get_trajectory(trajectory_id)]
    except (StoreError, KeyError) as e:
        _fail(str(e.args[0]) if isinstance(e, KeyError) and e.args else str(e))
    results = []
    with store, SandboxPool(size=1) as pool:
        for t in trajs:
            if rescore:
                results.append(rp.rescore(store, t, sandbox_factory=pool.sandbox))
            else:
                results.append(rp.replay(store, t, sandbox_factory=pool.sandbox))
    matched = sum(r.matched for r in results)
    images = sum(r.images for r in results)
    diverged = [r.to_dict() for r in results if not r.matched]
    if as_json:
        typer.echo(json.dumps({"replayed": len(results), "matched": matched, "diverged": diverged,
                               "identical_images": images}))
    else:
        typer.echo(f"{'rescored' if rescore else 'replayed'} {len(results)}, matched {matched}"
                   + (f", {images} images re-rendered byte-identical" if images else ""))
        for d in diverged:
            div = d["divergence"] or {}
            typer.echo(f"  {d['trajectory_id']}: diverges at turn {div.get('turn')} ({div.get('field')})")
    if diverged:
        raise typer.Exit(1)
