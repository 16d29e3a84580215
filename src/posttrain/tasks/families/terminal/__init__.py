"""The `terminal` family: shell tasks in a sandboxed workspace, checked after the episode.

Domains `terminal.<group>.<name>` (find, count, grep, text transforms, config files, git,
permissions, processes, archives) are generated from seeds; each checks the final workspace
and/or the submitted answer with a check script (`script` verifier) that receives the expected
state on stdin at grading time. `terminal.harbor.<name>` domains are loaded from task folders in
the Harbor / Terminal-Bench layout (see `harbor.py`); the examples shipped in `examples/harbor/`
are registered here.
"""

from __future__ import annotations

from pathlib import Path

from posttrain.tasks.domain import Domain
from posttrain.tasks.families.terminal import config, find, git, system, transform
from posttrain.tasks.families.terminal.common import terminal_domain
from posttrain.tasks.families.terminal.harbor import HarborTaskError, load_harbor_task
from posttrain.tasks.registry import BrokenDomain

GROUPS = (find.DOMAINS, transform.DOMAINS, config.DOMAINS, git.DOMAINS, system.DOMAINS)

EXAMPLES_DIR = Path(__file__).resolve().parents[5] / "examples" / "harbor"
"""the repository's example Harbor tasks (present in a source checkout, not in a wheel)"""


def harbor_examples() -> list[Domain | BrokenDomain]:
    """The example folders as domains; a malformed one is a `BrokenDomain` (reported, skipped)."""
    if not EXAMPLES_DIR.is_dir():
        return []
    out: list[Domain | BrokenDomain] = []
    for p in sorted(EXAMPLES_DIR.iterdir()):
        if (p / "task.toml").is_file():
            try:
                out.append(load_harbor_task(p))
            except HarborTaskError as e:  # its message starts with "<folder>/<file>: "
                msg = str(e)
                where = f"{p.parent}/{msg}" if msg.startswith(p.name + "/") else f"{p}: {msg}"
                out.append(BrokenDomain(f"terminal.harbor.{p.name}", where))
    return out


def domains() -> list[Domain | BrokenDomain]:
    out = [terminal_domain(f"terminal.{suffix}", draw, description, tags=(suffix.split(".")[0],))
           for group in GROUPS for suffix, draw, description in group]
    return out + harbor_examples()


__all__ = ["HarborTaskError", "domains", "load_harbor_task"]
