"""Workloads on the one episode engine: `posttrain rollout` (scripted episodes into a store),
`posttrain tasks check` (every domain's oracle, negatives and adversaries; mounted in `tasks`) and
`posttrain replay` (stored episodes re-run and compared, or re-scored)."""

from __future__ import annotations

import json
import threading
import uuid
from contextlib import AbstractContextManager, ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import typer

from posttrain.cli_params import non_negative, share
from posttrain.tasks.sources.cli import apply_sources, source_option

if TYPE_CHECKING:
    from posttrain.envs.single import SandboxFactory
    from posttrain.policies.base import Policy
    from posttrain.rollout.replay import ReplayResult
    from posttrain.sandbox.base import Sandbox
    from posttrain.tasks.check import CheckReport
    from posttrain.values.trajectory import Trajectory


def _fail(message: str) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


def rollout(policy: str = typer.Option("oracle", "--policy",
                                       help="scripted policy (oracle, empty, or wrong), or a model "
                                            "directory (config.json) run in-process"),
            mode: str = typer.Option("standard", "--mode",
                                     help="standard, or fast (speculative decoding and a prefix cache "
                                          "across turns; model directories)"),
            temperature: float = typer.Option(1.0, "--temperature", callback=non_negative,
                                              help="model sampling; 0 = greedy"),
            max_tokens: int = typer.Option(64, "--max-tokens", min=1, help="model tokens per turn"),
            domains: str = typer.Option(..., "--domains", help="glob(s), comma-separated, e.g. 'math.add.*'"),
            n: int = typer.Option(2, "--n", min=1, help="tasks per domain (seeds 0..N-1)"),
            run_dir: Path = typer.Option(..., "--run-dir", help="where the store is written"),
            split: str = typer.Option("train", "--split", help="train or eval"),
            workers: int = typer.Option(2, "--workers", min=1, help="environment steps in parallel"),
            max_infra_rate: float = typer.Option(0.05, "--max-infra-rate", callback=share,
                                                 help="exit 3 when more episodes than this share are "
                                                      "infrastructure errors"),
            as_json: bool = typer.Option(False, "--json", help="print a JSON summary"),
            source: list[str] | None = source_option()) -> None:
    """Run episodes with a scripted policy or a model over the matching domains and store them.
    Domains with no tasks in --split (an imported task folder lives in one) are skipped."""
    from posttrain import runlock
    from posttrain.errors import EXIT_UNTRUSTWORTHY
    from posttrain.policies.scripted import ScriptedPolicy
    from posttrain.scheduling.engine import WorkItem, run_workload
    from posttrain.storage.store import Store, StoreError
    from posttrain.tasks.domain import NoTasksInSplit
    from posttrain.tasks.registry import RegistryError, match_domains
    from posttrain.tasks.sources import absolute
    from posttrain.values.generation import SamplingParams
    from posttrain.values.task import Split

    if split not in ("train", "eval"):
        _fail(f"--split must be 'train' or 'eval', got {split!r}")
    if mode not in ("standard", "fast"):
        _fail(f"--mode must be 'standard' or 'fast', got {mode!r}")
    apply_sources(source)
    try:
        matched = match_domains(domains)
        agent = _model_policy(policy, mode) if Path(policy).is_dir() else None
        if agent is None and mode != "standard":
            _fail(f"--mode {mode} needs a model directory as --policy, not {policy!r}")
        scripted = agent or ScriptedPolicy.named(policy)
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
    store.start_run(run_id, {"kind": "rollout", "policy": policy, "mode": mode, "domains": domains, "n": n,
                             "split": split, "sources": [absolute(s) for s in source or []]})
    with store:
        run_workload(specs, scripted, SamplingParams(temperature=temperature, max_tokens=max_tokens),
                     workers=workers, run_id=run_id,
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


def _model_policy(path: str, mode: str) -> Policy:
    """A Hugging Face model directory as an in-process `TorchPolicy` in `mode`."""
    if not (Path(path) / "config.json").is_file():
        raise ValueError(f"--policy {path}: the directory has no config.json (not a Hugging Face model directory)")
    from transformers.utils import logging as hf_logging

    from posttrain.policies.local import TorchPolicy

    hf_logging.disable_progress_bar()  # the summary line is the output
    return TorchPolicy(path, mode=mode)


def check(family: str | None = typer.Option(None, "--family", "-f", help="only this family"),
          domains: str | None = typer.Option(None, "--domains", "-d",
                                                help="comma-separated glob patterns, e.g. 'math.*,text.sort.*'"),
          per_domain: int = typer.Option(5, "--per-domain", "-n", min=1, help="tasks per domain"),
          workers: int = typer.Option(1, "--workers", "-w", min=1,
                               help="processes (on 2 cores, 2 made the reasoning-gym checks with "
                                    "their constant-answer probes 1.77x faster: "
                                    "benchmarks/tasks_check.py)"),
          guess_tasks: int = typer.Option(200, "--guess-tasks", min=0,
                                          help="train tasks per directly graded domain for the "
                                               "constant-answer probe (0: skip it)"),
          as_json: bool = typer.Option(False, "--json", help="print a JSON summary instead of tables"),
          source: list[str] | None = source_option()) -> None:
    """Self-check domains: oracle passes, negatives fail, grading is stable, generation is
    deterministic. Exits 1 on any failure (including infrastructure errors). With --source and
    no --domains/--family, checks the domains the sources add. Domains that one constant answer
    games (the constant-answer probe) are listed as guessable, and those whose train and eval
    splits hold different answer shares as 'splits differ': warnings, not failures."""
    import fnmatch

    added = apply_sources(source)
    if added and not domains and not family:
        domains = ",".join(added)
    from posttrain.scheduling.domain_check import check_domains
    from posttrain.tasks import registry
    from posttrain.tasks.cli import select_domains

    report = check_domains(select_domains(family, domains), per_domain=per_domain, workers=workers,
                           guess_tasks=guess_tasks, sources=source or ())
    # a task folder that does not even load is a failed check of the domains it was asked for
    patterns = [p.strip() for p in (domains or "*").split(",") if p.strip()]
    broken = {n: b.error for n, b in registry.broken().items()
              if any(fnmatch.fnmatchcase(n, p) for p in patterns)
              and (family is None or n.startswith(family + ".") or n.startswith("plugin "))}
    if as_json:
        typer.echo(json.dumps({**report.summary(), "broken": broken}))
    else:
        _print_report(report)
        for n, error in broken.items():
            typer.echo(f"broken {n}: {error}")
    raise typer.Exit(0 if report.ok and not broken else 1)


def _print_report(report: CheckReport) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console()
    table = Table("family", "domains", "unchecked", "tasks", "oracle ok", "negs failed", "hacks passed",
                  "flips", "infra", "cpu s", title="posttrain tasks check")
    for fam, checks in sorted(report.by_family().items()):
        tasks = sum(c.tasks for c in checks)
        negs = sum(c.negatives for c in checks)
        table.add_row(fam, str(len(checks)), str(sum(bool(c.not_checked) for c in checks)), str(tasks),
                      f"{sum(c.oracle_passed for c in checks)}/{tasks}",
                      f"{sum(c.negatives_failed for c in checks)}/{negs}",
                      f"{sum(c.hacks_passed for c in checks)}/{sum(c.hacks for c in checks)}",
                      str(sum(c.flips for c in checks)), str(sum(c.infra_errors for c in checks)),
                      f"{sum(c.seconds for c in checks):.2f}")
    console.print(table)
    counts = [f"{c.domain} {c.tasks}" for c in report.checks]
    if len(counts) <= 40:
        console.print("tasks checked per domain: " + ", ".join(counts), highlight=False)
    else:
        by_n: dict[int, int] = {}
        for c in report.checks:
            by_n[c.tasks] = by_n.get(c.tasks, 0) + 1
        console.print("tasks checked per domain: " + ", ".join(
            f"{n} tasks: {k} domains" for n, k in sorted(by_n.items())), highlight=False)
    for c in report.checks:
        if c.not_checked:
            console.print(f"[yellow]not checked[/yellow] {c.domain}: {escape(c.not_checked)}")
    for f in report.failures[:50]:
        console.print(f"[red]{f.kind}[/red] {f.domain} seed={f.seed} split={f.split}: {escape(f.detail)}",
                      highlight=False)
    if len(report.failures) > 50:
        console.print(f"... and {len(report.failures) - 50} more failures (use --json for all)")
    for c in report.checks:
        if c.guess is not None and c.guess.guessable:
            console.print(f"[yellow]guessable[/yellow] {c.domain}: the constant answer "
                          f"{escape(repr(c.guess.answer[:40]))} passes {c.guess.rate:.0%} of {c.guess.tasks} "
                          f"train tasks (uniform chance {c.guess.chance:.0%}): a policy can learn it "
                          "instead of the task", highlight=False)
        if c.guess is not None and c.guess.splits_differ:
            console.print(f"[yellow]splits differ[/yellow] {c.domain}: its train and eval tasks hold the "
                          f"answers they share in different shares (p = {c.guess.split_p:.1e}, "
                          f"{c.guess.tasks} tasks a split): a prior learned in training is rewarded "
                          "or punished by chance in evaluation", highlight=False)
    s = report.summary()
    rate = s["tasks"] / report.seconds if report.seconds else 0.0
    console.print(f"{s['domains']} domains, {s['tasks']} tasks in {report.seconds:.1f}s ({rate:.1f} tasks/s); "
                  f"oracle pass {s['oracle_pass_rate']:.3f}, negatives failed {s['negative_fail_rate']:.3f}, "
                  f"hack pass {s['hack_pass_rate']:.3f}, flip rate {s['flip_rate']:.4f}; "
                  f"{len(report.failures)} failures, "
                  f"{s['not_checked']} not checked", highlight=False)


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
    from posttrain.scheduling.replay import replay_many
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
    results: list[ReplayResult] = []
    with store, ExitStack() as stack:
        pools: dict[tuple[int | None, tuple[str, ...]], SandboxPool] = {}
        opening = threading.Lock()  # episodes open their sandboxes on the engine's workers

        def on_clock(clock: int | None, preload: tuple[str, ...]) -> SandboxFactory:
            """Sandboxes on `clock` (the one each episode recorded) with the preloads of its
            domain (module files its tools need among them), from a pool opened at need."""
            def open_one() -> AbstractContextManager[Sandbox]:
                with opening:
                    if (clock, preload) not in pools:
                        pools[clock, preload] = stack.enter_context(
                            SandboxPool(size=1, clock=clock, preload=preload))
                return pools[clock, preload].sandbox()
            return open_one

        def sandbox_for(t: Trajectory) -> SandboxFactory:
            return on_clock(rp.recorded_clock(t), rp.recorded_preload(t))

        try:
            if rescore:
                results = [rp.rescore(store, t, sandbox_factory=sandbox_for(t)) for t in trajs]
            else:
                results = replay_many(store, trajs, sandbox_for=sandbox_for, render=render)
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
