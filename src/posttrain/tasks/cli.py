"""`posttrain tasks`: list domains, show a generated task, self-check domains.

Imports nothing heavy at module level: families load on the first registry look-up.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from posttrain.tasks.sources.cli import apply_sources, source_option

app = typer.Typer(no_args_is_help=True, add_completion=False,
                  help="Task domains: list them, show a generated task, check oracles and negatives.")


def _select(family: str | None, domains: str | None):
    from posttrain.tasks import registry

    try:
        chosen = registry.match_domains(domains) if domains else list(registry.all_domains().values())
    except registry.RegistryError as e:
        raise typer.BadParameter(str(e), param_hint="--domains") from None
    if family:
        chosen = [d for d in chosen if d.family == family]
        if not chosen:
            known = ", ".join(sorted(registry.families()))
            raise typer.BadParameter(f"no domain of family {family!r} (families: {known})",
                                     param_hint="--family")
    return chosen


@app.command("list")
def list_(family: str | None = typer.Option(None, "--family", "-f", help="only this family"),
          as_json: bool = typer.Option(False, "--json", help="print JSON instead of a table"),
          source: list[str] | None = source_option()) -> None:
    """List domains with their family, environment kind and verifier."""
    apply_sources(source)
    chosen = _select(family, None)
    rows = [{"name": d.name, "family": d.family, "env": d.env,
             "verifier": f"{d.verifier.name}@{d.verifier.version}"} for d in chosen]
    if as_json:
        typer.echo(json.dumps({"domains": rows}))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table("domain", "family", "env", "verifier", title=f"{len(rows)} domains")
    for r in rows:
        table.add_row(r["name"], r["family"], r["env"], r["verifier"])
    Console().print(table)


@app.command()
def show(domain: str = typer.Argument(..., help="domain name, e.g. math.add.d2"),
         seed: int = typer.Option(0, "--seed", help="generator seed"),
         split: str = typer.Option("train", "--split", help="train or eval"),
         as_json: bool = typer.Option(False, "--json", help="print the whole Task as JSON"),
         source: list[str] | None = source_option()) -> None:
    """Generate one task and print its prompt, files and (hidden) reference."""
    from posttrain.tasks import registry

    apply_sources(source)
    if split not in ("train", "eval"):
        raise typer.BadParameter(f"must be 'train' or 'eval', got {split!r}", param_hint="--split")
    try:
        d = registry.get_domain(domain)
    except registry.RegistryError as e:
        raise typer.BadParameter(str(e), param_hint="DOMAIN") from None
    task = d.task(seed, split)  # type: ignore[arg-type]
    if as_json:
        typer.echo(task.model_dump_json(indent=2))
        return
    typer.echo(f"# {task.key}  (env {task.env}, verifier {d.verifier.name}@{d.verifier.version}, "
               f"hash {task.hash[:12]})")
    typer.echo("## prompt\n" + task.prompt)
    for path, content in sorted(task.files.items()):
        typer.echo(f"## file {path}\n{content.rstrip()}")
    typer.echo("## reference (hidden from the policy)\n" + json.dumps(task.reference, indent=2))
    if task.verifier:
        typer.echo("## verifier settings\n" + json.dumps(task.verifier, indent=2))


@app.command()
def check(family: str | None = typer.Option(None, "--family", "-f", help="only this family"),
          domains: str | None = typer.Option(None, "--domains", "-d",
                                                help="comma-separated glob patterns, e.g. 'math.*,text.sort.*'"),
          per_domain: int = typer.Option(5, "--per-domain", "-n", min=1, help="tasks per domain"),
          workers: int = typer.Option(1, "--workers", "-w", min=1,
                               help="processes (2 did not help on a shared 2-core machine: "
                                    "see benchmarks/tasks_check.py)"),
          as_json: bool = typer.Option(False, "--json", help="print a JSON summary instead of tables"),
          source: list[str] | None = source_option()) -> None:
    """Self-check domains: oracle passes, negatives fail, grading is stable, generation is
    deterministic. Exits 1 on any failure (including infrastructure errors). With --source and
    no --domains/--family, checks the domains the sources add."""
    import fnmatch

    added = apply_sources(source)
    if added and not domains and not family:
        domains = ",".join(added)
    from posttrain.tasks import registry
    from posttrain.tasks.check import check_domains

    report = check_domains(_select(family, domains), per_domain=per_domain, workers=workers)
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


def _print_report(report) -> None:
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
    s = report.summary()
    rate = s["tasks"] / report.seconds if report.seconds else 0.0
    console.print(f"{s['domains']} domains, {s['tasks']} tasks in {report.seconds:.1f}s ({rate:.1f} tasks/s); "
                  f"oracle pass {s['oracle_pass_rate']:.3f}, negatives failed {s['negative_fail_rate']:.3f}, "
                  f"hack pass {s['hack_pass_rate']:.3f}, flip rate {s['flip_rate']:.4f}; "
                  f"{len(report.failures)} failures, "
                  f"{s['not_checked']} not checked", highlight=False)


def init_domain(name: str = typer.Argument(..., help="the family name, e.g. mytasks (lowercase, "
                                                     "digits, '_')"),
                directory: Path | None = typer.Option(None, "--dir",
                                                      help="where to write the package (default: "
                                                           "./posttrain-NAME); must be new or empty")) -> None:
    """Write a ready task-family plugin package (entry point, generator, verifier, oracle,
    negatives, a test) that passes `posttrain tasks check` as generated."""
    from posttrain.errors import EXIT_BAD_INPUT
    from posttrain.tasks import registry
    from posttrain.tasks.scaffold import ScaffoldError, write_package

    target = directory or Path(f"posttrain-{name.replace('_', '-')}")
    try:
        written = write_package(name, target, taken=set(registry.families()))
    except ScaffoldError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(EXIT_BAD_INPUT) from None
    typer.echo(f"wrote {len(written)} files to {target}: " + ", ".join(map(str, written)))
    typer.echo(f"next: pip install -e {target} && posttrain tasks check --family {name}")
