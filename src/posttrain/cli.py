"""The `posttrain` command: thin; each concept folder owns its sub-commands in `<folder>/cli.py`.

Sub-command modules must import nothing heavy (torch, transformers, ray) at module level, so that
`posttrain --help` and `posttrain sandbox check` start fast.
"""

from __future__ import annotations

import importlib

import typer

app = typer.Typer(no_args_is_help=True, add_completion=False,
                  help="posttrain: reinforcement learning on verifiable tasks, at scale.")

# (module, attribute, how it is mounted): a typer app becomes a group, a function a command;
# "group name" mounts a command inside an earlier group (e.g. "tasks contamination").
_SUBCOMMANDS: list[tuple[str, str, str]] = [
    ("posttrain.sandbox.cli", "app", "sandbox"),
    ("posttrain.images.cli", "app", "image"),
    ("posttrain.tasks.cli", "app", "tasks"),
    ("posttrain.scheduling.cli", "check", "tasks check"),
    ("posttrain.tasks.cli", "init_domain", "init-domain"),
    ("posttrain.scheduling.cli", "rollout", "rollout"),
    ("posttrain.scheduling.cli", "replay", "replay"),
    ("posttrain.storage.cli", "export", "export"),
    ("posttrain.pipeline.cli", "run", "run"),
    ("posttrain.runs_cli", "runs", "runs"),
    ("posttrain.evaluation.cli", "app", "eval"),
    ("posttrain.evaluation.cli", "report", "report"),
    ("posttrain.evaluation.tasks_cli", "contamination", "tasks contamination"),
    ("posttrain.evaluation.tasks_cli", "noise", "tasks noise"),
]


def _mount(root: typer.Typer, subcommands: list[tuple[str, str, str]]) -> None:
    """Mount every sub-command; a mistyped module, attribute or group is an error here, at import
    time, rather than a sub-command that silently goes missing."""
    groups: dict[str, typer.Typer] = {}
    for module_name, attr, name in subcommands:
        obj = getattr(importlib.import_module(module_name), attr)
        parent, _, leaf = name.rpartition(" ")
        if parent and parent not in groups:
            raise ValueError(f"sub-command {name!r} ({module_name}.{attr}): no group {parent!r} "
                             "is mounted before it")
        target = groups[parent] if parent else root
        if isinstance(obj, typer.Typer):
            target.add_typer(obj, name=leaf)
            groups[name] = obj
        else:
            target.command(name=leaf)(obj)


@app.command()
def version() -> None:
    """Print posttrain's version."""
    from posttrain import __version__

    typer.echo(__version__)


_mount(app, _SUBCOMMANDS)


def main() -> None:
    from posttrain.errors import run_cli

    run_cli(app)  # bad input and a full disk are one line on stderr, not a traceback


if __name__ == "__main__":
    main()
