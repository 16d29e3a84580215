"""Building blocks of the geometry family: the `model` tool, problems, domain builders.

Splits: every size a problem draws with `half` is a value of its split (`value_split`: the multiples of 0.5 whose double is
3 mod 5 -- 1.5, 4, 6.5, -1, ... -- are eval values, the rest train ones), so an eval problem
differs from every training problem in each drawn size. Without that, two problems one number
apart (a stool 6.5 or 7 high, a sphere one coordinate away) are near-duplicates to the
contamination guard -- and with checks that do not read that number, graded identically; in a
small parameter space such pairs are found as soon as the sample grows. A range with no value
of the split (0.5 to 1) is drawn whole, and counts (`rng.randint`) are not partitioned: a
problem that drew no partitioned size is in the split its statement's hash says, as elsewhere.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from posttrain.tasks.domain import Domain, ToolSpec
from posttrain.tasks.families.common import content_split, draw_in_split
from posttrain.values.task import Split, Task, TaskLimits
from posttrain.verifiers.geometry import GEOMETRY

if TYPE_CHECKING:
    from posttrain.sandbox.base import Sandbox

TOOL_LIMITS = TaskLimits(max_turns=8, max_tokens=512, context_tokens=4096, time_s=180.0,
                         command_timeout_s=30.0)
SCRIPT_LIMITS = TaskLimits(max_turns=1, max_tokens=512, context_tokens=2048, time_s=90.0)
TOOL_OUTPUT_CHARS = 3000

API = ("ptgeo (z is up; every primitive is centred on the origin): box(x, y, z) with sizes along "
       "x, y, z; cylinder(r, h) and cone(r, h) with their axis along z; sphere(r); "
       "tube(r_outer, r_inner, h). Parts: p.translate(x, y, z), p.move_to(x, y, z) (moves the "
       "bounding-box centre there), p.rotate(x=deg, y=deg, z=deg), p.scale(s) or p.scale(sx, sy, sz), "
       "p.mirror('x'), p.named('name'), a + b (union), a - b (difference), a & b (intersection), "
       "p.volume, p.bounds, p.size, p.center. save(part or [parts], 'file.json'), "
       "info(part or [parts]) prints measurements.")


def run_model(sandbox: Sandbox, code: str) -> str:
    """The `model` tool: run `code` with `from ptgeo import *` in the workspace (warm path)."""
    if not code.strip():
        raise ValueError("the model tool needs Python code, e.g. save(box(1, 2, 3), 'model.json')")
    result = sandbox.run_python("from ptgeo import *\n" + code)
    head = f"exit {result.exit_code}" if result.limit is None else f"killed: {result.limit.value} limit"
    out = "\n".join(x for x in (head, result.stdout.rstrip("\n"), result.stderr.rstrip("\n")) if x)
    if len(out) > TOOL_OUTPUT_CHARS:
        out = out[:TOOL_OUTPUT_CHARS // 2] + "\n[... output cut ...]\n" + out[-TOOL_OUTPUT_CHARS // 2:]
    return out


PTGEO_FILE = str(Path(__file__).with_name("ptgeo.py"))
"""the modeling API: a geometry sandbox shows it as /opt/posttrain/inside/ptgeo.py (the path its
tracebacks name, in recorded observations and in the shipped model's corpus, with line numbers:
an edit to it makes recorded episodes that show one replay as diverged, and changes the sandbox
image digest recorded in trajectories)"""
PRELOAD = ("numpy", "manifold3d", PTGEO_FILE)
"""what a geometry domain's sandbox needs: the API file, shown inside and imported once by the
warm interpreter with the kernel it uses, so a `model` call starts in milliseconds"""

MODEL_TOOL = ToolSpec(name="model", run=run_model,
                      description="run Python with `from ptgeo import *` (the 3D modeling API) in the workspace")


@dataclass(frozen=True)
class GeoProblem:
    prompt: str
    """what to build, with numbers (the API and how to save are added by the builder)"""
    checks: list[dict[str, Any]]
    oracle: str
    """ptgeo code that builds and saves the model"""
    wrong: dict[str, str]
    """named plausible wrong ptgeo programs (each must fail)"""
    file: str = "model.json"
    data: dict[str, Any] = field(default_factory=dict)


def fmt(x: float) -> str:
    """A number as it appears in prompts and code (no float noise)."""
    return f"{round(x, 6):g}"


@dataclass
class _Drawing:
    split: Split
    partitioned: bool = False
    """whether a size of the split was drawn (then the problem is in the split by construction)"""


_DRAWING: ContextVar[_Drawing | None] = ContextVar("geometry_drawing", default=None)
"""the problem being drawn (set by `_draw` around the generator)"""


def value_split(value: float) -> Split:
    """The split a drawn size belongs to (module docstring)."""
    return "eval" if round(value * 2) % 5 == 3 else "train"


def half(rng: random.Random, lo: float, hi: float) -> float:
    """A multiple of 0.5 in [lo, hi]; while a problem is drawn for a split, one of that split's
    values when the range has any."""
    drawing = _DRAWING.get()
    if drawing is not None:
        own = [h for h in range(int(lo * 2), int(hi * 2) + 1) if value_split(h / 2) == drawing.split]
        if own:
            drawing.partitioned = True
            return rng.choice(own) / 2
    return rng.randint(int(lo * 2), int(hi * 2)) / 2


def _draw(name: str, split: Split, seed: int, draw: Callable[[random.Random], GeoProblem]) -> GeoProblem:
    """A problem of `split`: its sizes are the split's values; one with no partitioned size (all
    its ranges too small) is in the split its statement's hash says."""
    def in_split(rng: random.Random) -> tuple[GeoProblem, bool]:
        drawing = _Drawing(split)
        token = _DRAWING.set(drawing)
        try:
            return draw(rng), drawing.partitioned
        finally:
            _DRAWING.reset(token)

    return draw_in_split(name, split, seed, in_split,
                         lambda d: split if d[1] else content_split(d[0].prompt))[0][0]


def tool_domain(name: str, draw: Callable[[random.Random], GeoProblem], description: str) -> Domain:
    """A `tools` domain: the policy builds the model with the `model` tool, then submits."""

    def generate(seed: int, split: Split) -> Task:
        p = _draw(name, split, seed, draw)
        prompt = (f"{p.prompt} Save it to {p.file} with save(...).\n"
                  f'Use the modeling tool <tool name="model">PYTHON</tool>, then <submit></submit>. {API}')
        return Task(domain=name, prompt=prompt, env="tools", split=split, seed=seed, limits=TOOL_LIMITS,
                    tags=("geometry",), reference={"oracle": p.oracle, "wrong": p.wrong, **p.data},
                    verifier={"file": p.file, "checks": p.checks})

    def negatives(task: Task) -> dict[str, list[str]]:
        out = {"empty": ["<submit></submit>"]}
        for key, code in task.reference["wrong"].items():
            out[key] = [f'<tool name="model">{code}</tool>', "<submit></submit>"]
        return out

    return Domain(name=name, family="geometry", env="tools", verifier=GEOMETRY, generate=generate,
                  oracle=lambda t: [f'<tool name="model">{t.reference["oracle"]}</tool>', "<submit></submit>"],
                  negatives=negatives, description=description, tags=("geometry",), tools=(MODEL_TOOL,),
                  preload=PRELOAD)


def script_domain(name: str, draw: Callable[[random.Random], GeoProblem], description: str) -> Domain:
    """A `single` domain: the answer is a ptgeo script, run by the verifier in the sandbox."""

    def generate(seed: int, split: Split) -> Task:
        p = _draw(name, split, seed, draw)
        prompt = (f"{p.prompt} Write a Python script that builds it and saves it to {p.file} with "
                  f"save(...); `from ptgeo import *` is already done. {API} "
                  f"Answer with the script in a ```python code block.")
        return Task(domain=name, prompt=prompt, env="single", split=split, seed=seed, limits=SCRIPT_LIMITS,
                    tags=("geometry", "script"), reference={"oracle": p.oracle, "wrong": p.wrong, **p.data},
                    verifier={"file": p.file, "checks": p.checks, "script": True})

    def fence(code: str) -> str:
        return f"```python\n{code.rstrip()}\n```"

    def negatives(task: Task) -> dict[str, list[str]]:
        out = {"empty": [""]}
        out.update({key: [fence(code)] for key, code in task.reference["wrong"].items()})
        return out

    return Domain(name=name, family="geometry", env="single", verifier=GEOMETRY, generate=generate,
                  oracle=lambda t: [fence(t.reference["oracle"])], negatives=negatives, stop=(),
                  description=description, tags=("geometry", "script"), preload=PRELOAD)
