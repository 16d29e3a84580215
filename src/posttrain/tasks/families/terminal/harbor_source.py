"""A folder of Harbor task folders (a Terminal-Bench checkout, `examples/harbor/`) as domains.

`harbor_domains(path)`: `path` is one task folder (it has a `task.toml`) or a folder holding task
folders at any depth up to `MAX_DEPTH` (the layout of Terminal-Bench and Harbor registries: one
folder per task). Each becomes `terminal.harbor.<folder name>`; one that does not load is a
`BrokenDomain` naming its folder and the reason (reported and skipped by the registry and the
commands that do not need it); two folders with the same name are an error naming both.
"""

from __future__ import annotations

from pathlib import Path

from posttrain.tasks.domain import Domain
from posttrain.tasks.families.terminal.harbor import HarborTaskError, load_harbor_task
from posttrain.tasks.registry import BrokenDomain

MAX_DEPTH = 3


class HarborSourceError(ValueError):
    """A path that holds no task folder, or two task folders with the same name."""


def task_folders(path: Path) -> list[Path]:
    """The task folders at or under `path` (sorted), not descending into a task folder."""
    if (path / "task.toml").is_file():
        return [path]
    found: list[Path] = []
    frontier = [path]
    for _ in range(MAX_DEPTH):
        nxt: list[Path] = []
        for d in frontier:
            for child in sorted(p for p in d.iterdir() if p.is_dir() and not p.name.startswith(".")):
                (found if (child / "task.toml").is_file() else nxt).append(child)
        frontier = nxt
    return sorted(found)


def harbor_domains(path: str | Path, *, build_network: bool = False) -> list[Domain | BrokenDomain]:
    """`build_network`: the tasks' images are built with the host's network (`?network=1`)."""
    path = Path(path)
    if not path.is_dir():
        raise HarborSourceError(f"{path}: not a directory (expected a Harbor task folder or a "
                                "folder of them)")
    folders = task_folders(path)
    if not folders:
        raise HarborSourceError(f"{path}: no Harbor task folder (a folder with task.toml) there "
                                f"or up to {MAX_DEPTH} levels below")
    out: list[Domain | BrokenDomain] = []
    seen: dict[str, Path] = {}
    for folder in folders:
        name = f"terminal.harbor.{folder.name.lower()}"
        if name in seen:
            raise HarborSourceError(f"two task folders named {folder.name!r}: {seen[name]} and "
                                    f"{folder} (domain names come from folder names)")
        seen[name] = folder
        try:
            domain = load_harbor_task(folder, build_network=build_network)
            seen[domain.name] = folder
            out.append(domain)
        except HarborTaskError as e:  # its message starts with "<folder>/<file>: "
            msg = str(e)
            where = f"{folder.parent}/{msg}" if msg.startswith(folder.name + "/") else f"{folder}: {msg}"
            out.append(BrokenDomain(name, where))
    return out
