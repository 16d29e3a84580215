"""The geometry family: ptgeo in the sandbox, every oracle through the environment, sampled
negatives, and the geometry verifier's checks and defences (non-watertight meshes, links,
garbage files, planted modules, scripts that hang or exit early)."""

from __future__ import annotations

import json

import pytest

from posttrain.envs import play_actions
from posttrain.tasks.families import geometry
from posttrain.tasks.families.geometry.common import PRELOAD, PTGEO_FILE
from posttrain.values.task import Task
from posttrain.verifiers.base import Outcome, VerifierError
from posttrain.verifiers.geometry import GEOMETRY

DOMAINS = {d.name: d for d in geometry.domains()}


# What a geometry domain's sandbox preloads (its API file, ptgeo.py, among them), and trimesh
# for the tests that write meshes.
SANDBOX_PRELOAD = (*PRELOAD, "trimesh")


def test_family_has_enough_domains():
    tools = [d for d in DOMAINS.values() if d.env == "tools"]
    assert len(tools) >= 30 and len(DOMAINS) > len(tools)
    assert all(d.tools and d.tools[0].name == "model" for d in tools)
    assert all(d.family == "geometry" for d in DOMAINS.values())


def test_generation_is_deterministic_and_split_by_content():
    for d in DOMAINS.values():
        hashes = {"train": set(), "eval": set()}
        for split in ("train", "eval"):
            for seed in range(3):
                task = d.task(seed, split)
                assert task.model_dump_json() == d.task(seed, split).model_dump_json()
                assert task.split == split
                hashes[split].add(task.hash)
        assert not hashes["train"] & hashes["eval"], d.name


@pytest.mark.slow
def test_every_oracle_passes_and_sampled_negatives_fail(sandbox, module_sandbox):
    sb, clean = module_sandbox
    for i, d in enumerate(DOMAINS.values()):
        task = d.task(i % 3, "eval" if i % 2 else "train")
        sb.restore(clean)
        v = play_actions(d, task, d.oracle(task), sandbox=sandbox)
        assert v.passed, (d.name, dict(v.details))
        negatives = d.negatives(task)
        assert "empty" in negatives and len(negatives) >= 2
        names = (list(negatives) if i % 12 == 0 else
                 [n for n in negatives if n != "empty"][:1] if i % 4 == 0 else [])
        for name in names:
            sb.restore(clean)
            nv = play_actions(d, task, negatives[name], sandbox=sandbox)
            assert not nv.passed, (d.name, name, dict(nv.details))


def test_ptgeo_comes_from_the_family_at_its_inside_path(sandbox):
    # the sandbox package knows no family: the domains bring the API file as a preload
    assert all(any(p.endswith("/geometry/ptgeo.py") for p in d.preload) for d in DOMAINS.values())
    assert sandbox.info.modules == (PTGEO_FILE,)
    bad = geometry.MODEL_TOOL.run(sandbox, "box(-1, 2, 3)")
    if sandbox.info.backend == "bwrap":  # recorded observations name this path
        assert 'File "/opt/posttrain/inside/ptgeo.py"' in bad


@pytest.mark.slow
def test_model_tool_reports_errors_as_observations(sandbox):
    tool = geometry.MODEL_TOOL
    out = tool.run(sandbox, "b = box(1, 2, 3).named('b')\ninfo(b)\nsave(b, 'b.json')")
    assert out.startswith("exit 0") and "volume 6" in out and "saved 1 part" in out
    bad = tool.run(sandbox, "box(-1, 2, 3)")
    assert bad.startswith("exit 1") and "x must be a positive number" in bad
    dup = tool.run(sandbox, "save([box(1, 1, 1).named('a'), sphere(1).named('a')], 'x.json')")
    assert "two parts are named 'a'" in dup
    assert "unknown file type" in tool.run(sandbox, "save(box(1, 1, 1), 'x.step')")
    with pytest.raises(ValueError):
        tool.run(sandbox, "   ")


def _scene(parts: dict[str, tuple[list, list]]) -> str:
    return json.dumps({"format": "ptgeo-scene", "version": 1,
                       "parts": [{"name": n, "vertices": v, "faces": f} for n, (v, f) in parts.items()]})


def _cube(x0=0.0, y0=0.0, z0=0.0, s=1.0, drop_face=False):
    v = [[x0 + dx * s, y0 + dy * s, z0 + dz * s] for dx in (0, 1) for dy in (0, 1) for dz in (0, 1)]
    f = [[0, 1, 3], [0, 3, 2], [4, 6, 7], [4, 7, 5], [0, 4, 5], [0, 5, 1],
         [2, 3, 7], [2, 7, 6], [0, 2, 6], [0, 6, 4], [1, 5, 7], [1, 7, 3]]
    return v, f[:-1] if drop_face else f


def _verify(sandbox, checks, file="m.json", answer=""):
    task = Task(domain="geometry.t", prompt="p", env="tools", verifier={"file": file, "checks": checks})
    return GEOMETRY.verify(task, Outcome(answer=answer, sandbox=sandbox))


@pytest.mark.slow
def test_checks_on_hand_made_meshes(sandbox):
    sandbox.write_file("m.json", _scene({"a": _cube(), "b": _cube(z0=1.0), "c": _cube(x0=3.0, drop_face=True)}))
    ok = [{"kind": "parts", "names": ["a", "b", "c"]},
          {"kind": "watertight", "part": "a"},
          {"kind": "volume", "part": "a", "value": 1.0},
          {"kind": "extents", "part": "a", "value": [1, 1, 1]},
          {"kind": "center", "part": "b", "value": [0.5, 0.5, 1.5]},
          {"kind": "bounds", "part": "c", "min": [3, 0, 0], "max": [4, 1, 1]},
          {"kind": "rests_on", "a": "b", "b": "a"}, {"kind": "rests_on", "a": "a", "b": "ground"},
          {"kind": "contact", "a": "a", "b": "b"},
          {"kind": "no_overlap", "parts": ["a", "b"]},
          {"kind": "distance", "a": "a", "b": "b", "value": 1.0},
          {"kind": "centroid", "part": "a", "value": [0.5, 0.5, 0.5]},
          {"kind": "symmetric", "part": "a", "axis": "x", "tol": 1.0}]
    v = _verify(sandbox, ok)
    assert v.passed, dict(v.details)
    bad = [{"kind": "watertight", "part": "c"}, {"kind": "volume", "part": "c", "value": 1.0},
           {"kind": "volume", "part": "a", "value": 1.05, "rel_tol": 0.02},
           {"kind": "rests_on", "a": "a", "b": "b"}, {"kind": "contact", "a": "a", "b": "c"},
           {"kind": "symmetric", "part": "a", "axis": "x"}, {"kind": "extents", "part": "zz", "value": [1, 1, 1]},
           {"kind": "no_overlap", "parts": "*"}]
    for check in bad:
        v = _verify(sandbox, [check])
        assert not v.passed, check
    # overlapping solids
    sandbox.write_file("m.json", _scene({"a": _cube(), "b": _cube(x0=0.5)}))
    v = _verify(sandbox, [{"kind": "no_overlap", "parts": "*"}])
    assert not v.passed and v.details["failed"][0]["overlap"][2] == pytest.approx(0.5)


@pytest.mark.parametrize("setup, reason", [
    ("", "no model file"),
    ("ln -s /etc/passwd m.json", "no model file"),
    ("mkfifo m.json", "no model file"),
    ("echo '{\"parts\": 3}' > m.json", "not a ptgeo JSON scene"),
    ("printf 'glTF garbage' > m.glb", "cannot load m.glb"),
    ("echo '{\"parts\": [{\"name\": \"a\", \"vertices\": [[0,0,0]], \"faces\": [[0, 1, 2]]}]}' > m.json", "failed"),
])
def test_bad_files_fail_with_a_reason(sandbox, setup, reason):
    if setup:
        sandbox.run(setup)
    file = "m.glb" if "m.glb" in setup else "m.json"
    v = _verify(sandbox, [{"kind": "volume", "part": "*", "value": 1.0}], file=file)
    assert not v.passed
    assert reason in str(v.details.get("reason", "")) + str(v.details.keys()), dict(v.details)


def test_planted_modules_do_not_reach_the_grader(sandbox):
    sandbox.write_file("m.json", _scene({"a": _cube()}))
    for name in ("numpy.py", "manifold3d.py", "json.py", "trimesh.py"):
        sandbox.write_file(name, "raise SystemExit('shadowed')\n")
    assert _verify(sandbox, [{"kind": "volume", "part": "a", "value": 1.0}]).passed


@pytest.mark.slow
def test_script_answers_run_in_their_own_process(sandbox):
    task = DOMAINS["geometry.script.box.dims"].task(0)
    d = DOMAINS["geometry.script.box.dims"]
    assert play_actions(d, task, d.oracle(task), sandbox=sandbox).passed
    settings = dict(task.verifier, script_timeout_s=1.0)
    quick = task.model_copy(update={"verifier": settings})
    hang = GEOMETRY.verify(quick, Outcome(answer="```python\nwhile True:\n    pass\n```", sandbox=sandbox))
    assert not hang.passed and "ran past" in hang.details["reason"]
    sandbox.run("rm -f model.json")
    forge = GEOMETRY.verify(quick, Outcome(answer="import os\nprint('@@ptgrade:x@@{\"passed\": true}')\nos._exit(0)",
                                           sandbox=sandbox))
    assert not forge.passed and "no model file" in forge.details["reason"]
    crash = GEOMETRY.verify(quick, Outcome(answer="raise RuntimeError('boom')", sandbox=sandbox))
    assert not crash.passed and "failed" in crash.details["reason"] and "boom" in crash.details["script_output"]


def test_unknown_check_kind_is_an_infrastructure_error(sandbox):
    sandbox.write_file("m.json", _scene({"a": _cube()}))
    with pytest.raises(VerifierError):
        _verify(sandbox, [{"kind": "teleport", "part": "a"}])
    with pytest.raises(VerifierError):
        _verify(sandbox, [])


def test_prompts_state_the_split_by_their_sizes():
    # every size a problem draws is a value of its split, so eval and train boxes differ in each
    import re

    from posttrain.tasks.families.geometry.common import value_split

    d = DOMAINS["geometry.box.dims"]
    for split in ("train", "eval"):
        for seed in range(5):
            statement = d.task(seed, split).prompt.split(" Save it to")[0]
            sizes = [float(x) for x in re.findall(r"\d+(?:\.\d+)?", statement)][:3]  # x, y, z
            assert {value_split(x) for x in sizes} == {split}, statement


def test_an_empty_part_fails_cleanly(sandbox):
    sandbox.write_file("m.json", _scene({"a": ([], [])}))
    v = _verify(sandbox, [{"kind": "extents", "part": "*", "value": [1, 1, 1]}])
    assert not v.passed and "empty" in v.details["reason"]
    d = DOMAINS["geometry.bool.plate-hole"]
    task = d.task(1, "eval")
    sandbox.run("rm -f m.json")
    v = play_actions(d, task, d.negatives(task)["radius"], sandbox=sandbox)  # the hole may eat the plate
    assert not v.passed
