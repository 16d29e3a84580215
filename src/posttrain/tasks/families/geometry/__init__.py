"""The `geometry` family: 3D modeling with ptgeo, verified by geometric constraints.

* `geometry.<group>.<name>` (`tools` env): the policy drives the modeling tool
  (`<tool name="model">PYTHON</tool>`, Python with `from ptgeo import *`; see `ptgeo.py` here,
  which the sandbox shows as `/opt/posttrain/inside/ptgeo.py`) to build a part or a named
  assembly and save it; the `geometry` verifier then loads the file in the sandbox and checks
  volumes, bounding boxes, watertightness, contacts, overlaps, distances and symmetry with
  documented tolerances.
* `geometry.drawing.<name>` (`tools` env, images): the part is shown as a drawing, not described
  in numbers; a `render` tool draws what the policy saved (see `drawings.py`).
* `geometry.script.<name>` (`single` env): the answer is the modeling script itself, run by the
  verifier in the sandbox before the checks.

Numbers are multiples of 0.5 (units: cm); splits are by the content of the problem statement.
"""

from __future__ import annotations

from posttrain.tasks.domain import Domain
from posttrain.tasks.families.geometry import assemblies, drawings, shapes
from posttrain.tasks.families.geometry.common import MODEL_TOOL, script_domain, tool_domain

__all__ = ["MODEL_TOOL", "domains"]


def domains() -> list[Domain]:
    out = [tool_domain(f"geometry.{suffix}", draw, description)
           for group in (shapes.DOMAINS, assemblies.DOMAINS) for suffix, draw, description in group]
    by_name = {suffix: (draw, description) for suffix, draw, description in shapes.DOMAINS}
    out += [script_domain(f"geometry.script.{suffix}", *by_name[suffix]) for suffix in shapes.SCRIPT_DOMAINS]
    return out + drawings.domains()
