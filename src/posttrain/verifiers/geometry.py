"""The `geometry` verifier: load a model the policy saved and check geometric constraints.

Grades in a fresh grading sandbox holding only a copy of the model file (`grading.py`:
nonce-marked result, nothing the episode left running or planted). It loads the file named by
`task.verifier["file"]`: a ptgeo JSON scene (numpy only), or a
.glb/.gltf/.ply/.stl/.obj file through trimesh (one part per named scene node; one part named
"model" for single-mesh formats). Every part is rebuilt as a manifold3d solid: a part that is not
a closed, edge-manifold mesh is *not watertight*, and checks that need a solid fail on it.

In `single` domains (`"script": true`) the answer is a ptgeo script: it first runs (`from ptgeo
import *` prepended) in the episode's sandbox with a time budget, then what it saved is copied
into the grading sandbox. A script that fails or hangs is a failed verdict.

Only the solid the triangles make counts: a vertex no triangle uses fails the model, bounding
boxes come from the parts' vertices, and when the task's reference has an oracle script
(`task.reference["oracle"]`, built once per task in a pristine grading sandbox before anything
of the policy's is read, `reference_model`) the model
must be the reference's shape: as many parts (the same names when there are several; a stray
marker part fails) and per part a volume IoU within the checks' own tolerances (`same_shape`).

Checks (`task.verifier["checks"]`, all must pass). `part` is a part name or "*" (all parts,
united); tolerances are absolute lengths (`abs_tol`, default 0.01) or relative volumes
(`rel_tol`, default 0.02 — round primitives are polygons and lose up to ~1 % of volume):

| kind | fields | passes when |
| --- | --- | --- |
| `parts` | `names` | the model has exactly these part names |
| `watertight` | `part` | the part is a closed manifold |
| `volume` | `part`, `value`, `rel_tol` | volume within rel_tol of value |
| `extents` | `part`, `value` [x,y,z] | bounding-box size within abs_tol per axis |
| `center` | `part`, `value` [x,y,z] | bounding-box centre within abs_tol per axis |
| `bounds` | `part`, `min`, `max` | bounding box corners within abs_tol |
| `no_overlap` | `parts` (names or "*") | every pair intersects in at most 1e-4 of the smaller volume |
| `contact` | `a`, `b`, `max_gap` (0.01) | the surfaces are at most max_gap apart |
| `rests_on` | `a`, `b` (a part or "ground") | a's bottom is at b's top (or z = 0) within abs_tol, footprints overlap |
| `distance` | `a`, `b`, `value` | distance between bounding-box centres within abs_tol |
| `centroid` | `part`, `value` [x,y,z] | centre of mass (uniform density) within abs_tol per axis |
| `symmetric` | `part`, `axis` | the part and its mirror image across the plane axis = 0 share >= 99 % of volume |

What it does not check: appearance, topology beyond watertightness (genus), or how the model
was built; a model that meets every constraint passes, however it was made.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from posttrain.values.verdict import Verdict
from posttrain.verifiers.base import GradingFailed, Outcome, VerifierError, failed_grading, verdict
from posttrain.verifiers.candidate import extract_code
from posttrain.verifiers.grading import GRADER_MARGIN_S, candidate_sandbox, grading_context, grading_sandbox, run_grader

if TYPE_CHECKING:
    from posttrain.values.task import Task

MAX_MODEL_BYTES = 16 << 20
MAX_TRIANGLES = 200_000
SCRIPT_TIMEOUT_S = 20.0
"""budget of a single-answer modeling script (ptgeo import included)"""
SHAPE_ABS_TOL = 0.01
SHAPE_REL_TOL = 0.02
"""the shape-identity check allows what the checks allow (see `same_shape` in the grader)"""
CHECK_KINDS = frozenset({"parts", "watertight", "volume", "extents", "center", "bounds", "no_overlap",
                         "contact", "rests_on", "distance", "centroid", "symmetric"})
GRADER_PRELOAD = ("numpy", "numpy.ma", "manifold3d")
"""imported once by the grading sandbox's warm interpreter (`numpy.ma`: the first `np.unique`
of a process imports it, ~12 ms of every grade otherwise)"""

GRADER = r'''
import math, subprocess, time
import numpy as np
import manifold3d as m

p = _PAYLOAD
result = {"checks": []}


def finish(**kw):
    result.update(kw)
    emit(result)
    sys.exit(0)



def read_model(path):
    """The bytes of a regular file, or a failure reason (str)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return f"no model file {path} (or it is a link)"
    with os.fdopen(fd, "rb") as f:
        import stat
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            return f"{path} is not a regular file"
        if st.st_size > p["max_bytes"]:
            return f"{path} is larger than {p['max_bytes']} bytes"
        return f.read()


import base64
# trusted: the model the task's oracle script saved (`REFERENCE`, built before any policy input)
reference = base64.b64decode(p["reference_model"]) if p.get("reference_model") else None

policy_input()  # from here on the grader reads the policy's model
path = p["file"]
data = read_model(path)
if isinstance(data, str):
    finish(passed=False, reason=data)


def load_parts(data, path):
    """[(name, vertices (n, 3) float64, faces (k, 3) int64)] or a failure reason (str)."""
    if path.lower().endswith(".json"):
        try:
            scene = json.loads(data)
            items = scene["parts"]
            out = []
            for item in items:
                v = np.asarray(item["vertices"], dtype=np.float64).reshape(-1, 3)
                f = np.asarray(item["faces"], dtype=np.int64).reshape(-1, 3)
                out.append((str(item["name"]), v, f))
            return out
        except (ValueError, KeyError, TypeError) as e:
            return f"{path} is not a ptgeo JSON scene: {type(e).__name__}: {e}"[:300]
    import io, trimesh
    try:
        loaded = trimesh.load(io.BytesIO(data), file_type=path.rsplit(".", 1)[-1].lower(), force="scene",
                              process=False)
        out = []
        for node in loaded.graph.nodes_geometry:
            transform, geom = loaded.graph[node]
            mesh = loaded.geometry[geom].copy()
            mesh.apply_transform(transform)
            out.append((str(node), np.asarray(mesh.vertices, float), np.asarray(mesh.faces, np.int64)))
        if len(out) == 1 and not path.lower().endswith((".glb", ".gltf")):
            out = [("model", out[0][1], out[0][2])]
        return out
    except Exception as e:  # any parser error of a policy-written file is the policy's
        return f"cannot load {path}: {type(e).__name__}: {e}"[:300]


parts = load_parts(data, path)
if isinstance(parts, str):
    finish(passed=False, reason=parts)
if not parts:
    finish(passed=False, reason=f"{path} holds no mesh")
if sum(len(f) for _, _, f in parts) > p["max_triangles"]:
    finish(passed=False, reason=f"more than {p['max_triangles']} triangles")

def build(parts):
    """(solids by name, meshes by name) or a failure reason. Only the solid the triangles make
    counts: a vertex no triangle uses (a stray point at an asked corner) fails the model."""
    solids, meshes = {}, {}
    for name, v, f in parts:
        if name in meshes:
            return f"two parts are named {name!r}"
        if len(v) == 0 or len(f) == 0:
            return f"part {name!r} is empty (no vertices or no triangles)"
        bad = not np.isfinite(v).all() or f.min() < 0 or f.max() >= len(v)
        if not bad and len(np.unique(f)) != len(v):
            return f"part {name!r} has {len(v) - len(np.unique(f))} vertices that no triangle uses"
        meshes[name] = (v, f, bool(bad))
        if bad:
            continue
        try:
            mesh = m.Mesh(np.ascontiguousarray(v, np.float32), np.ascontiguousarray(f, np.uint32))
            mesh.merge()
            solid = m.Manifold(mesh)
        except Exception:  # a degenerate mesh the kernel refuses is simply not a solid
            continue
        if solid.status() == m.Error.NoError and not solid.is_empty():
            solids[name] = solid
    return solids, meshes


built = build(parts)
if isinstance(built, str):
    finish(passed=False, reason=built)
solids, meshes = built


def solid(name):
    if name == "*":
        if len(solids) != len(meshes):
            return None
        return m.Manifold.batch_boolean(list(solids.values()), m.OpType.Add)
    return solids.get(name)


def bbox(name):
    if name == "*":
        v = np.concatenate([mv for mv, _, _ in meshes.values()])
    elif name in meshes:
        v = meshes[name][0]
    else:
        return None
    if not np.isfinite(v).all():
        return np.full(3, np.nan), np.full(3, np.nan)  # compares false with every expected value
    return v.min(axis=0), v.max(axis=0)


def close(a, b, tol):
    return bool(np.all(np.abs(np.asarray(a, float) - np.asarray(b, float)) <= tol))


def rnd(x):
    return [round(float(c), 5) for c in x] if hasattr(x, "__len__") else round(float(x), 6)


def run_check(c):
    kind, tol = c["kind"], float(c.get("abs_tol", 0.01))
    if kind == "parts":
        got = sorted(meshes)
        return got == sorted(c["names"]), {"got": got[:20]}
    names = [c[k] for k in ("part", "a", "b") if k in c and c[k] not in ("*", "ground")]
    missing = [n for n in names if n not in meshes]
    if missing:
        return False, {"missing_part": missing[0]}
    part = c.get("part", "*")
    if kind == "watertight":
        return (solid(part) is not None), {}
    if kind in ("extents", "center", "bounds"):
        lo, hi = bbox(part)
        if kind == "extents":
            return close(hi - lo, c["value"], tol), {"got": rnd(hi - lo)}
        if kind == "center":
            return close((hi + lo) / 2, c["value"], tol), {"got": rnd((hi + lo) / 2)}
        return close(lo, c["min"], tol) and close(hi, c["max"], tol), {"got": [rnd(lo), rnd(hi)]}
    if kind == "distance":
        (la, ha), (lb, hb) = bbox(c["a"]), bbox(c["b"])
        d = float(np.linalg.norm((la + ha) / 2 - (lb + hb) / 2))
        return abs(d - c["value"]) <= tol, {"got": rnd(d)}
    if kind == "rests_on":
        la, ha = bbox(c["a"])
        if c["b"] == "ground":
            return abs(la[2]) <= tol, {"bottom": rnd(la[2])}
        lb, hb = bbox(c["b"])
        overlap = (min(ha[0], hb[0]) - max(la[0], lb[0]) > tol) and (min(ha[1], hb[1]) - max(la[1], lb[1]) > tol)
        return abs(la[2] - hb[2]) <= tol and overlap, {"bottom": rnd(la[2]), "top_below": rnd(hb[2])}
    if kind == "volume":
        s = solid(part)
        if s is None:
            return False, {"why": "not watertight"}
        vol = s.volume()
        return abs(vol - c["value"]) <= float(c.get("rel_tol", 0.02)) * abs(c["value"]), {"got": rnd(vol)}
    if kind == "contact":
        a, b = solid(c["a"]), solid(c["b"])
        if a is None or b is None:
            return False, {"why": "not watertight"}
        gap = float(c.get("max_gap", 0.01))
        got = a.min_gap(b, 2 * gap + 1e-9)
        return got <= gap, {"gap": rnd(got)}
    if kind == "no_overlap":
        names = sorted(meshes) if c.get("parts", "*") == "*" else c["parts"]
        for i, x in enumerate(names):
            for y in names[i + 1:]:
                a, b = solid(x), solid(y)
                if a is None or b is None:
                    return False, {"why": f"{x if a is None else y} is not watertight"}
                inter = (a ^ b).volume()
                if inter > 1e-4 * min(a.volume(), b.volume()) + 1e-9:
                    return False, {"overlap": [x, y, rnd(inter)]}
        return True, {}
    if kind == "centroid":
        s = solid(part)
        if s is None:
            return False, {"why": "not watertight"}
        mesh = s.to_mesh()
        v = np.asarray(mesh.vert_properties, float)[:, :3]
        tri = v[np.asarray(mesh.tri_verts, np.int64)]
        vols = np.einsum("ij,ij->i", tri[:, 0], np.cross(tri[:, 1], tri[:, 2])) / 6.0
        got = (vols[:, None] * tri.sum(axis=1) / 4.0).sum(axis=0) / vols.sum()
        return close(got, c["value"], tol), {"got": rnd(got)}
    if kind == "symmetric":
        s = solid(part)
        if s is None:
            return False, {"why": "not watertight"}
        axis = {"x": (1, 0, 0), "y": (0, 1, 0), "z": (0, 0, 1)}[c["axis"]]
        shared = (s ^ s.mirror(axis)).volume() / max(s.volume(), 1e-12)
        return shared >= 1 - float(c.get("tol", 0.01)), {"shared": rnd(shared)}
    raise ValueError(f"unknown check kind {kind!r}")


def same_shape():
    """The model is the reference's solid: the same number of parts (the same names when the
    reference has several) and per part a volume IoU of at least 1 - (2 * area * abs_tol +
    rel_tol * volume) / volume: the checks let every surface point be abs_tol off (a symmetric
    difference of at most area * abs_tol) and the volume rel_tol off (tessellation); twice the
    surface allowance covers both parts of a pair being off. A cylinder in place of its bounding
    box (IoU 0.79), a marker part or a hollow shell fails it."""
    ref = load_parts(reference, path)
    if isinstance(ref, str):
        raise RuntimeError(f"cannot load the reference model: {ref}")
    built = build(ref)
    if isinstance(built, str):
        raise RuntimeError(f"the reference model is malformed: {built}")
    ref_solids, ref_meshes = built
    if len(ref_meshes) == 1:
        if len(meshes) != 1:
            return False, {"why": f"the model has {len(meshes)} parts, the task one"}
        pairs = [(next(iter(ref_meshes)), next(iter(meshes)))]
    else:
        if sorted(meshes) != sorted(ref_meshes):
            return False, {"why": "the part names differ from the task's", "got": sorted(meshes)[:20]}
        pairs = [(n, n) for n in sorted(ref_meshes)]
    ious = {}
    for rname, name in pairs:
        want, got = ref_solids.get(rname), solids.get(name)
        if want is None:
            continue
        if got is None:
            return False, {"why": f"part {name!r} is not a closed solid"}
        vol = want.volume()
        inter = (want ^ got).volume()  # one boolean: the union's volume follows from it
        union = vol + got.volume() - inter
        iou = inter / union if union > 0 else 0.0
        need = 1.0 - (2.0 * want.surface_area() * p["abs_tol"] + p["rel_tol"] * vol) / max(vol, 1e-12)
        ious[name] = rnd(iou)
        if not iou >= max(0.5, need):
            return False, {"why": f"part {name!r} is not the task's shape", "iou": rnd(iou),
                           "needed": rnd(max(0.5, need))}
    return True, {"iou": ious}


failed = []
for c in p["checks"]:
    ok, info = run_check(c)
    if not ok:
        failed.append({"check": c["kind"], **{k: c[k] for k in ("part", "a", "b") if k in c}, **info})
if reference is not None:
    ok, info = same_shape()
    if not ok:
        failed.append({"check": "same_shape", **info})
finish(passed=not failed, failed=failed[:8], parts=sorted(meshes)[:20])
'''


# Builds the reference model from the task's oracle script, in a pristine grading sandbox that
# holds nothing of the policy's (no artifacts copied, no policy input): its bytes are trusted.
REFERENCE = r'''
import base64, contextlib, io, tempfile
p = _PAYLOAD
ref_dir = tempfile.mkdtemp(prefix="ptgeo-ref-")
os.chdir(ref_dir)
with contextlib.redirect_stdout(io.StringIO()):
    exec(compile("from ptgeo import *\n" + p["reference"], "reference.py", "exec"), {"__name__": "reference"})
try:
    fd = os.open(p["file"], os.O_RDONLY | os.O_NOFOLLOW)
except OSError:
    raise RuntimeError(f"the reference script saved no model {p['file']}") from None
with os.fdopen(fd, "rb") as f:
    emit({"model": base64.b64encode(f.read()).decode()})
'''

REFERENCE_CACHE_SIZE = 256
"""reference models kept in memory (one per task; a `tasks check` grades each task ~12 times)"""
REFERENCE_CACHE_BYTES = 64 << 20
"""and at most this many bytes of them (base64), the least recently used dropped first"""
_references: OrderedDict[str, str] = OrderedDict()
_references_lock = threading.Lock()
_building: dict[str, threading.Lock] = {}
"""a lock per reference being built: a check grades a task's oracle, negatives and hacks
concurrently, and without it each grade that missed the cache built the same reference again"""


def reference_model(script: str, file: str, like: Any, label: str) -> str:
    """The model (base64) that the task's oracle `script` saves as `file`, built once per
    script, file and module set in a pristine grading sandbox, then reused. Sound because the
    reference is the task's own deterministic construction, built before (and apart from)
    anything of the policy's: every grade of that task would build the same bytes. Keyed by the
    script's text and the module files (`ptgeo`) it runs over, never by the task's name."""
    modules = tuple(sorted(like.info.modules)) if like is not None else ()
    key = hashlib.sha256(json.dumps([script, file, modules, _module_digest(modules)]).encode()).hexdigest()
    with _references_lock:
        if key in _references:
            _references.move_to_end(key)
            return _references[key]
        gate = _building.setdefault(key, threading.Lock())
    try:
        with gate:  # one build per key at a time; the others wait for it and take its model
            with _references_lock:
                if key in _references:
                    _references.move_to_end(key)
                    return _references[key]
            model = _build_reference(script, file, like, label)
            with _references_lock:
                _references[key] = model
                while len(_references) > REFERENCE_CACHE_SIZE or (
                        len(_references) > 1 and sum(map(len, _references.values())) > REFERENCE_CACHE_BYTES):
                    _references.popitem(last=False)
            return model
    finally:  # a failed build is not remembered: whoever waited builds it again
        with _references_lock:
            if _building.get(key) is gate and not gate.locked():
                del _building[key]


def _build_reference(script: str, file: str, like: Any, label: str) -> str:
    with grading_sandbox(like, GRADER_PRELOAD) as sandbox:
        found = run_grader(sandbox, REFERENCE, {"reference": script, "file": file},
                           timeout=60.0 + GRADER_MARGIN_S, label=f"{label}: building the reference")
    model = found.get("model")
    if not isinstance(model, str):
        raise VerifierError(f"{label}: the reference build returned no model ({found!r:.200})")
    return model


def _module_digest(paths: tuple[str, ...]) -> list[str]:
    """Content digests of the module files (an edited ptgeo builds a different reference)."""
    out = []
    for path in paths:
        try:
            with open(path, "rb") as f:
                out.append(hashlib.sha256(f.read()).hexdigest())
        except OSError:
            out.append("")
    return out


@dataclass(frozen=True)
class GeometryVerifier:
    """Checks a saved 3D model against constraints (see the module docstring).

    `task.verifier`: `file` (workspace path of the model), `checks` (list), optionally
    `script: true` (the answer is a ptgeo script to run first) and `script_timeout_s`."""

    name: str = "geometry"
    version: str = "2"
    needs_sandbox: bool = True

    def verify(self, task: Task, outcome: Outcome) -> Verdict:
        s = task.verifier
        if not isinstance(s.get("file"), str) or not isinstance(s.get("checks"), list) or not s["checks"]:
            raise VerifierError(f"task {task.key}: geometry verifier needs 'file' and a non-empty 'checks' list")
        unknown = [c.get("kind") if isinstance(c, dict) else c for c in s["checks"]
                   if not (isinstance(c, dict) and c.get("kind") in CHECK_KINDS)]
        if unknown:  # a task's bug, found before anything of the policy's is read
            raise VerifierError(f"task {task.key}: unknown geometry check kind(s) {unknown[:5]}")
        ref = task.reference.get("oracle") if isinstance(task.reference, dict) else None
        payload: dict[str, Any] = {"file": s["file"], "checks": s["checks"], "max_bytes": MAX_MODEL_BYTES,
                                   "max_triangles": MAX_TRIANGLES, "reference_model": None,
                                   "abs_tol": SHAPE_ABS_TOL, "rel_tol": SHAPE_REL_TOL}
        label = f"geometry verifier, task {task.key}"
        try:
            with candidate_sandbox(outcome) as sandbox:
                if isinstance(ref, str):  # `sandbox` only lends its configuration (modules, limits)
                    payload["reference_model"] = reference_model(ref, s["file"], sandbox, label)
                if s.get("script"):
                    failed = self._run_script(task, outcome, sandbox)
                    if failed is not None:
                        return failed
                with grading_context(Outcome(outcome.answer, sandbox), include=[s["file"]],
                                     preload=GRADER_PRELOAD, label=label) as grader:
                    found = run_grader(grader, GRADER, payload, timeout=60.0 + GRADER_MARGIN_S, label=label)
        except GradingFailed as e:
            return failed_grading(self, e)
        passed = found.pop("passed", None)
        if not isinstance(passed, bool):
            raise VerifierError(f"task {task.key}: geometry grader returned no verdict ({found!r:.200})")
        return verdict(self, passed, **found)

    def _run_script(self, task: Task, outcome: Outcome, sandbox: Any) -> Verdict | None:
        """Run a single-answer modeling script in the candidate's sandbox (never where it is
        graded); a failed verdict if it fails, else None."""
        from posttrain.sandbox.base import SandboxError

        code = extract_code(outcome.answer or "")
        if not code.strip():
            return verdict(self, False, reason="no modeling script")
        timeout = float(task.verifier.get("script_timeout_s", SCRIPT_TIMEOUT_S))
        try:
            r = sandbox.run_python("from ptgeo import *\n" + code, timeout=timeout)
        except SandboxError as e:
            raise VerifierError(f"task {task.key}: the sandbox failed while running the script: {e}") from e
        output = (r.stdout + r.stderr)[-600:]
        if r.limit is not None:
            why = (f"ran past {timeout:g} s" if r.limit.value == "timeout"
                   else f"was stopped by the {r.limit.value} limit")
            return verdict(self, False, reason=f"the modeling script {why}", script_output=output)
        if r.exit_code != 0:
            return verdict(self, False, reason=f"the modeling script failed (exit status {r.exit_code})",
                           script_output=output)
        return None


GEOMETRY = GeometryVerifier()
