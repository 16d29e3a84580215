"""`posttrain tasks`: list domains, show a generated task. (`tasks check` plays episodes on the
engine: `posttrain.scheduling.cli` mounts it.)

Imports nothing heavy at module level: families load on the first registry look-up.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from posttrain.tasks.sources.cli import apply_sources, source_option

app = typer.Typer(no_args_is_help=True, add_completion=False,
                  help="Task domains: list them, show a generated task, check oracles and negatives.")


def select_domains(family: str | None, domains: str | None):
    """The domains of `--family` / `--domains` (glob patterns); a bad value is a usage error."""
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
    chosen = select_domains(family, None)
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
    for path, entry in sorted(task.entries.items()):
        what = (f"symlink -> {entry.target}" if entry.kind == "symlink" else
                f"{entry.kind}, mode {entry.mode or 0:04o}" + (f", {len(entry.data)} bytes"
                                                              if entry.kind == "file" else ""))
        typer.echo(f"## {path} ({what})")
    typer.echo("## reference (hidden from the policy)\n" + json.dumps(task.reference, indent=2))
    if task.verifier:
        typer.echo("## verifier settings\n" + json.dumps(task.verifier, indent=2))


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
