"""Geometry from a drawing: `geometry.drawing.<shape>` (image domains, `tools` env).

The first observation shows a three-view drawing of the target part (rendered from the task's
reference program, `render.draw_views`) and names only the kind of part; the sizes and the
placement are read off the drawing (its ticks mark the part's extremes). The policy builds the
part with the `model` tool, may look at what it built with the `render` tool (which returns
a drawing of its saved scene), and submits; the `geometry` verifier checks the same constraints
as the text domain the problem comes from.

Textual fallback (a text-only policy): the drawing is replaced by the text domain's statement,
with its numbers -- the same task in words.

The prompt names the drawing by a number taken from the statement's hash (`drawing_number`),
as a real drawing carries its number: without it every task of a domain had the same text, and
what tells two problems apart (the picture) is not in the text that the contamination guard
compares -- every eval task was an exact duplicate of every train task. Same drawing, same
number; the number says nothing about the sizes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

from posttrain.tasks.domain import Domain
from posttrain.tasks.families.geometry import shapes
from posttrain.tasks.families.geometry.common import API, MODEL_TOOL, PRELOAD, TOOL_LIMITS, GeoProblem, _draw
from posttrain.tasks.families.geometry.render import RENDER_TOOL, draw_views, ptgeo_meshes
from posttrain.values.image import Image
from posttrain.values.task import Split, Task
from posttrain.verifiers.geometry import GEOMETRY

SHAPES = ("box.dims", "cylinder.dims", "cylinder.lying", "cone.dims", "sphere.radius", "place.box-corner")
"""problems a drawing with its extremes marked determines fully (kind of part + bounding box)"""


def target_drawing(task: Task) -> tuple[Image, ...]:
    return (draw_views(ptgeo_meshes(task.reference["oracle"]), "target part"),)


def drawing_number(statement: str) -> str:
    """The drawing's number: 8 hex digits of its statement's hash (the split is decided by the
    same statement, so train and eval never share a number)."""
    return "D-" + hashlib.sha256(statement.encode()).hexdigest()[:8].upper()


def statement(task: Task) -> str:
    return "The drawing, in words: " + task.reference["statement"]


def drawing_domain(suffix: str, draw: Callable, description: str) -> Domain:
    name = f"geometry.drawing.{suffix}"

    def generate(seed: int, split: Split) -> Task:
        p: GeoProblem = _draw(name, split, seed, draw)
        prompt = (f"Model the part shown in drawing {drawing_number(p.prompt)} below ({description}). Units are cm, z is up; "
                  f"the ticks of each view mark the part's extremes. Save it to {p.file} with save(...).\n"
                  f'Use the modeling tool <tool name="model">PYTHON</tool>; <tool name="render">{p.file}'
                  f"</tool> draws what you saved; then <submit></submit>. {API}")
        return Task(domain=name, prompt=prompt, env="tools", split=split, seed=seed, limits=TOOL_LIMITS,
                    tags=("geometry", "vision"), verifier={"file": p.file, "checks": p.checks},
                    reference={"oracle": p.oracle, "wrong": p.wrong, "statement": p.prompt, **p.data})

    def oracle(task: Task) -> list[str]:
        file = task.verifier["file"]
        return [f'<tool name="model">{task.reference["oracle"]}</tool>',
                f'<tool name="render">{file}</tool>', "<submit></submit>"]

    def negatives(task: Task) -> dict[str, list[str]]:
        out = {"empty": ["<submit></submit>"]}
        for key, code in task.reference["wrong"].items():
            out[key] = [f'<tool name="model">{code}</tool>', "<submit></submit>"]
        return out

    return Domain(name=name, family="geometry", env="tools", verifier=GEOMETRY, generate=generate,
                  oracle=oracle, negatives=negatives, description=f"{description}, from a drawing",
                  tags=("geometry", "vision"), tools=(MODEL_TOOL, RENDER_TOOL), preload=PRELOAD,
                  images=target_drawing, text_fallback=statement)


def domains() -> list[Domain]:
    by_name = {suffix: (draw, description) for suffix, draw, description in shapes.DOMAINS}
    return [drawing_domain(s, *by_name[s]) for s in SHAPES]
