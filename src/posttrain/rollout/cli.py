"""`posttrain replay`: re-run stored episodes (`posttrain rollout` is in `posttrain.scheduling.cli`)."""

from __future__ import annotations

import json
from contextlib import ExitStack
from pathlib import Path
from typing import NoReturn

import typer


def _fail(message: str) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


def replay(run_dir: Path = typer.Argument(..., help="a run directory"),
           trajectory_id: str = typer.Argument(None, help="a trajectory id (or unique prefix)"),
           all_: bool = typer.Option(False, "--all", help="every trajectory of the store"),
           rescore: bool = typer.Option(False, "--rescore",
                                        help="re-verify the stored outcome with the current verifier"),
           model: Path = typer.Option(None, "--model", help="the policy's model directory: every replayed "
                                      "prompt's token ids must also equal the recorded ones (its tokenizer)"),
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
    # domains of run-time sources (data:, harbor:, verifiers:) exist only once their sources are
    # read again: the ones the store's runs were made with
    from posttrain.tasks.sources import SourceError, recorded_sources, use_sources

    sources = recorded_sources(r["config"] for r in store.runs())
    try:
        use_sources(sources)
    except SourceError as e:
        _fail(f"{run_dir}: a task source this run was made with cannot be read again: {e}")
    render = None
    if model is not None:
        from posttrain.policies.local import TorchPolicy

        render = TorchPolicy(model, device="cpu").render
    results = []
    with store, ExitStack() as stack:
        pools: dict[tuple[int | None, tuple[str, ...]], SandboxPool] = {}

        def on_clock(clock: int | None, preload: tuple[str, ...]):
            """Sandboxes on `clock` (the one each episode recorded) with the preloads of its
            domain (module files its tools need among them), from a pool opened at need."""
            def open_one():
                if (clock, preload) not in pools:
                    pools[clock, preload] = stack.enter_context(
                        SandboxPool(size=1, clock=clock, preload=preload))
                return pools[clock, preload].sandbox()
            return open_one

        for t in trajs:
            try:
                factory = on_clock(rp.recorded_clock(t), rp.recorded_preload(t))
                if rescore:
                    results.append(rp.rescore(store, t, sandbox_factory=factory))
                else:
                    results.append(rp.replay(store, t, sandbox_factory=factory, render=render))
            except rp.ReplayInfraError as e:  # e.g. a task's image that cannot be built again
                _fail(f"{run_dir}: {e}" + (f" (the run's task sources: {', '.join(sources)})"
                                           if sources else ""))
    matched = sum(r.matched for r in results)
    images = sum(r.images for r in results)
    # an episode cut by a time limit need not reproduce: said per trajectory, not a failed check
    timing = [r.to_dict() for r in results if not r.matched and r.timing]
    diverged = [r.to_dict() for r in results if not r.matched and not r.timing]
    if as_json:
        typer.echo(json.dumps({"replayed": len(results), "matched": matched, "diverged": diverged,
                               "timing_dependent": timing, "identical_images": images}))
    else:
        typer.echo(f"{'rescored' if rescore else 'replayed'} {len(results)}, matched {matched}"
                   + (f", {images} images re-rendered byte-identical" if images else "")
                   + (f", {len(timing)} not reproducible (timing)" if timing else ""))
        for d in diverged + timing:
            div = d["divergence"] or {}
            why = f"; not reproducible: {d['timing']}" if d["timing"] else ""
            typer.echo(f"  {d['trajectory_id']}: diverges at turn {div.get('turn')} ({div.get('field')}){why}")
    if diverged:
        raise typer.Exit(1)
