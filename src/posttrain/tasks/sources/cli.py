"""The `--source` option that task-naming commands share (`tasks list/show/check`, `eval`,
`rollout`): each value is read and its domains registered before the command looks anything up."""

from __future__ import annotations

import typer

SOURCE_HELP = ("a task source whose domains to add (repeatable): data:PATH[?QUERY] for a "
               "JSONL/JSON/Parquet file or a datasets folder (see README, 'Bring your own tasks'); "
               "harbor:DIR for a Harbor/Terminal-Bench task folder or a folder of them; "
               "verifiers:NAME[?ARG=VALUE] for an installed verifiers environment")


def source_option() -> list[str] | None:
    return typer.Option(None, "--source", help=SOURCE_HELP)


def apply_sources(sources: list[str] | None) -> list[str]:
    """Register the sources' domains; a bad source is one line on stderr, exit 2. Returns the
    names of the domains they added."""
    if not sources:
        return []
    from posttrain.errors import EXIT_BAD_INPUT
    from posttrain.tasks.sources import SourceError, use_sources

    try:
        return [d.name for d in use_sources(sources)]
    except SourceError as e:
        typer.echo(f"error: --source: {e}", err=True)
        raise typer.Exit(EXIT_BAD_INPUT) from None
