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
from posttrain.tasks.families.terminal.harbor_source import harbor_domains
from posttrain.tasks.registry import BrokenDomain

GROUPS = (find.DOMAINS, transform.DOMAINS, config.DOMAINS, git.DOMAINS, system.DOMAINS)

EXAMPLES_DIR = Path(__file__).resolve().parents[5] / "examples" / "harbor"
"""the repository's example Harbor tasks (present in a source checkout, not in a wheel)"""


def harbor_examples() -> list[Domain | BrokenDomain]:
    """The example folders as domains; a malformed one is a `BrokenDomain` (reported, skipped)."""
    if not EXAMPLES_DIR.is_dir():
        return []
    return harbor_domains(EXAMPLES_DIR)


def domains() -> list[Domain | BrokenDomain]:
    out = [terminal_domain(f"terminal.{suffix}", draw, description, tags=(suffix.split(".")[0],))
           for group in GROUPS for suffix, draw, description in group]
    return out + harbor_examples()


__all__ = ["HarborTaskError", "domains", "harbor_domains", "load_harbor_task"]
