"""Pictures of 3D models: a three-view drawing (front, top, side) rendered on the CPU.

`draw_views` projects every triangle orthographically onto the three view planes and paints
them far-to-near (the painter's algorithm), shaded by how squarely each faces the viewer, with
matplotlib's Agg rasteriser (`posttrain.tasks.families.pictures`): the same scene always gives a
byte-identical PNG. Each view's axes carry ticks at the model's own extremes (and at 0), so a
reader can take the dimensions and the placement off the drawing.

The `render` tool of the geometry image domains draws the scene the policy saved: it reads the
JSON scene (`ptgeo.save(..., 'model.json')`) from the workspace through the sandbox API and draws
it here. The file is data, parsed as JSON with bounded size and triangle count; nothing of it is
executed outside the sandbox. What the painter's algorithm does *not* do: resolve triangles that
pierce each other (an overlapping assembly may show the wrong one in front where they cross).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from posttrain.tasks.domain import ToolOutput, ToolSpec
from posttrain.tasks.families.pictures import figure, png
from posttrain.values.image import Image

MAX_SCENE_BYTES = 8 * 1024 * 1024
MAX_TRIANGLES = 60_000
"""a scene with more is not drawn (the tool says so); the shipped primitives use a few hundred"""

Mesh = tuple[np.ndarray, np.ndarray]
"""(vertices n x 3 float, faces m x 3 int)"""

# view name, (horizontal axis, vertical axis), depth axis, sign: +1 = the viewer looks along +depth
VIEWS = (("front", (0, 2), 1, +1), ("top", (0, 1), 2, -1), ("side", (1, 2), 0, -1))
AXIS = "xyz"


def scene_meshes(data: bytes, path: str = "model.json") -> list[tuple[str, Mesh]]:
    """The named meshes of a ptgeo JSON scene; ValueError (naming the file) when it is not one."""
    if len(data) > MAX_SCENE_BYTES:
        raise ValueError(f"{path}: {len(data)} bytes, more than the {MAX_SCENE_BYTES} the renderer reads")
    try:
        scene = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not a JSON scene ({e}); save the model with save(part, '{path}')") from e
    if not isinstance(scene, dict) or scene.get("format") != "ptgeo-scene" or not isinstance(scene.get("parts"), list):
        raise ValueError(f"{path}: not a ptgeo scene (save the model with save(part, '{path}'))")
    out, triangles = [], 0
    for i, item in enumerate(scene["parts"]):
        try:
            v = np.asarray(item["vertices"], dtype=np.float64).reshape(-1, 3)
            f = np.asarray(item["faces"], dtype=np.int64).reshape(-1, 3)
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{path}: part {i} has no valid vertices/faces ({e})") from e
        if len(f) and (f.min() < 0 or f.max() >= len(v)) or not np.isfinite(v).all():
            raise ValueError(f"{path}: part {i} has faces outside its vertices or non-finite vertices")
        triangles += len(f)
        if triangles > MAX_TRIANGLES:
            raise ValueError(f"{path}: more than {MAX_TRIANGLES} triangles; the renderer draws smaller scenes")
        out.append((str(item.get("name") or f"part{i}"), (v, f)))
    if not out:
        raise ValueError(f"{path}: the scene has no parts")
    return out


def _ticks(lo: float, hi: float) -> list[float]:
    return sorted({round(lo, 3), round(hi, 3), *([0.0] if lo < 0 < hi else [])})


def draw_views(meshes: Sequence[Mesh], title: str = "") -> Image:
    """A 3-view drawing (front: x-z seen from -y; top: x-y from above; side: y-z from +x)."""
    tris = [v[f] for v, f in meshes if len(f)]
    if not tris:
        raise ValueError("nothing to draw: the scene has no triangles")
    t = np.concatenate(tris)  # (m, 3 corners, 3 coords)
    normals = np.cross(t[:, 1] - t[:, 0], t[:, 2] - t[:, 0])
    lengths = np.linalg.norm(normals, axis=1)
    keep = lengths > 1e-12
    t, normals = t[keep], normals[keep] / lengths[keep, None]
    lo, hi = t.reshape(-1, 3).min(axis=0), t.reshape(-1, 3).max(axis=0)
    pad = max(float((hi - lo).max()) * 0.08, 0.25)
    from matplotlib.collections import PolyCollection

    with figure(780, 300) as fig:
        for k, (name, (a, b), depth, sign) in enumerate(VIEWS):
            ax = fig.add_subplot(1, 3, k + 1)
            facing = normals[:, depth] * -sign  # > 0: the triangle faces the viewer
            order = np.argsort(t[:, :, depth].mean(axis=1) * -sign, kind="stable")[::-1]  # far first
            order = order[facing[order] > 0]
            shade = 0.35 + 0.55 * facing[order]
            colors = np.stack([shade * 0.55, shade * 0.7, shade * 0.95, np.ones_like(shade)], axis=1)
            polys = t[order][:, :, (a, b)]
            ax.add_collection(PolyCollection(polys, facecolors=colors, edgecolors=colors, linewidths=0.3))
            ax.set_xlim(lo[a] - pad, hi[a] + pad)
            ax.set_ylim(lo[b] - pad, hi[b] + pad)
            ax.set_aspect("equal")
            ax.set_xticks(_ticks(lo[a], hi[a]))
            ax.set_yticks(_ticks(lo[b], hi[b]))
            ax.tick_params(labelsize=8)
            ax.grid(True, linewidth=0.4, alpha=0.5)
            ax.set_title(f"{name} ({AXIS[a]} right, {AXIS[b]} up)", fontsize=9)
        if title:
            fig.suptitle(title, fontsize=10)
        fig.subplots_adjust(left=0.05, right=0.98, bottom=0.1, top=0.82, wspace=0.3)
        return png(fig)


def ptgeo_meshes(code: str) -> list[Mesh]:
    """The meshes a (trusted, generated) ptgeo program saves, built in this process: how an image
    domain draws its target from the task's reference program. Never call it on policy code."""
    from posttrain.tasks.families.geometry import ptgeo

    saved: list[Any] = []
    namespace: dict[str, Any] = {name: getattr(ptgeo, name) for name in ptgeo.__all__}
    namespace.update(save=lambda obj, path: saved.extend(ptgeo._parts(obj)),  # noqa: SLF001
                     info=lambda obj: None)
    exec(compile(code, "<reference>", "exec"), namespace)  # noqa: S102 - our own generated oracle
    if not saved:
        raise ValueError("the reference program saved nothing")
    return [p.mesh() for p in saved]


def run_render(sandbox: Any, args: str) -> ToolOutput:
    """The `render` tool: a 3-view drawing of the scene saved in the workspace."""
    path = args.strip() or "model.json"
    if not path.endswith(".json"):
        raise ValueError(f"render draws JSON scenes saved with save(part, 'model.json'), not {path!r}")
    meshes = scene_meshes(sandbox.read_file(path), path)
    lines = []
    for name, (v, f) in meshes:
        lo, hi = v.min(axis=0), v.max(axis=0)
        lines.append(f"{name}: {len(f)} triangles, min ({', '.join(f'{x:.4g}' for x in lo)}), "
                     f"max ({', '.join(f'{x:.4g}' for x in hi)})")
    image = draw_views([m for _, m in meshes], title=path)
    return ToolOutput("\n".join([f"drew {path}: front, top and side views", *lines]), (image,))


RENDER_TOOL = ToolSpec(name="render", run=run_render, returns_images=True,
                       description="draw the saved model (default model.json): front, top and side views")
