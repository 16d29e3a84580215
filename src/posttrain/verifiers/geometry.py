"""The `geometry` verifier: load a model the policy saved and check geometric constraints.

Runs in the episode's sandbox (warm path, nonce-marked result; see `script.py`). It loads the
file named by `task.verifier["file"]` from the workspace: a ptgeo JSON scene (numpy only), or a
.glb/.gltf/.ply/.stl/.obj file through trimesh (one part per named scene node; one part named
"model" for single-mesh formats). Every part is rebuilt as a manifold3d solid: a part that is not
a closed, edge-manifold mesh is *not watertight*, and checks that need a solid fail on it.

In `single` domains (`"script": true`) the answer is a ptgeo script: the grader first runs it
(`from ptgeo import *` prepended) in a separate process with the workspace as working
directory and a time budget, then loads what it saved. A script that fails or hangs is a failed
verdict; the grader's own failures are `VerifierError`s.

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

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from posttrain.values.verdict import Verdict
from posttrain.verifiers.base import Outcome, VerifierError, verdict
from posttrain.verifiers.code import extract_code
from posttrain.verifiers.script import GRADER_MARGIN_S, grading_sandbox, run_grader

if TYPE_CHECKING:
    from posttrain.values.task import Task

MAX_MODEL_BYTES = 16 << 20
MAX_TRIANGLES = 200_000
SCRIPT_TIMEOUT_S = 20.0
"""budget of a single-answer modeling script (ptgeo import included)"""

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


if p.get("script") is not None:
    import ptgeo  # to find its directory; the candidate's process imports it itself
    env = dict(os.environ, PYTHONPATH=os.path.dirname(ptgeo.__file__), PYTHONDONTWRITEBYTECODE="1")
    t0 = time.monotonic()
    try:
        r = subprocess.run([sys.executable, "-c", "from ptgeo import *\n" + p["script"]], env=env,
                           stdin=subprocess.DEVNULL, capture_output=True, timeout=p["script_timeout"],
                           start_new_session=True)
    except subprocess.TimeoutExpired:
        finish(passed=False, reason=f"the modeling script ran past {p['script_timeout']} s")
    result["script_output"] = (r.stdout + r.stderr)[-600:].decode("utf-8", "replace")
    if r.returncode != 0:
        finish(passed=False, reason=f"the modeling script failed (exit status {r.returncode})")

path = p["file"]
try:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
except OSError:
    finish(passed=False, reason=f"no model file {path} (or it is a link)")
with os.fdopen(fd, "rb") as f:
    import stat
    st = os.fstat(f.fileno())
    if not stat.S_ISREG(st.st_mode):
        finish(passed=False, reason=f"{path} is not a regular file")
    if st.st_size > p["max_bytes"]:
        finish(passed=False, reason=f"{path} is larger than {p['max_bytes']} bytes")
    data = f.read()


def load_parts():
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


parts = load_parts()
if isinstance(parts, str):
    finish(passed=False, reason=parts)
if not parts:
    finish(passed=False, reason=f"{path} holds no mesh")
if sum(len(f) for _, _, f in parts) > p["max_triangles"]:
    finish(passed=False, reason=f"more than {p['max_triangles']} triangles")

solids, meshes = {}, {}
for name, v, f in parts:
    if name in meshes:
        finish(passed=False, reason=f"two parts are named {name!r}")
    if len(v) == 0 or len(f) == 0:
        finish(passed=False, reason=f"part {name!r} is empty (no vertices or no triangles)")
    bad = not np.isfinite(v).all() or f.min() < 0 or f.max() >= len(v)
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


failed = []
for c in p["checks"]:
    ok, info = run_check(c)
    if not ok:
        failed.append({"check": c["kind"], **{k: c[k] for k in ("part", "a", "b") if k in c}, **info})
finish(passed=not failed, failed=failed[:8], parts=sorted(meshes)[:20])
'''


@dataclass(frozen=True)
class GeometryVerifier:
    """Checks a saved 3D model against constraints (see the module docstring).

    `task.verifier`: `file` (workspace path of the model), `checks` (list), optionally
    `script: true` (the answer is a ptgeo script to run first) and `script_timeout_s`."""

    name: str = "geometry"
    version: str = "1"
    needs_sandbox: bool = True

    def verify(self, task: Task, outcome: Outcome) -> Verdict:
        s = task.verifier
        if not isinstance(s.get("file"), str) or not isinstance(s.get("checks"), list) or not s["checks"]:
            raise VerifierError(f"task {task.key}: geometry verifier needs 'file' and a non-empty 'checks' list")
        payload: dict[str, Any] = {"file": s["file"], "checks": s["checks"], "max_bytes": MAX_MODEL_BYTES,
                                   "max_triangles": MAX_TRIANGLES, "script": None,
                                   "script_timeout": SCRIPT_TIMEOUT_S}
        budget = 60.0
        if s.get("script"):
            code = extract_code(outcome.answer or "")
            if not code.strip():
                return verdict(self, False, reason="no modeling script")
            payload["script"] = code
            payload["script_timeout"] = float(s.get("script_timeout_s", SCRIPT_TIMEOUT_S))
            budget += payload["script_timeout"]
        with grading_sandbox(outcome) as sandbox:
            found = run_grader(sandbox, GRADER, payload, timeout=budget + GRADER_MARGIN_S,
                               label=f"geometry verifier, task {task.key}")
        passed = found.pop("passed", None)
        if not isinstance(passed, bool):
            raise VerifierError(f"task {task.key}: geometry grader returned no verdict ({found!r:.200})")
        return verdict(self, passed, **found)


GEOMETRY = GeometryVerifier()
