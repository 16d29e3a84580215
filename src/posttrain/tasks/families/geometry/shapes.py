"""Single-part geometry problems: primitives, placement, rotation, scaling, booleans."""

from __future__ import annotations

import math
import random

from posttrain.tasks.families.geometry.common import GeoProblem, fmt, half


def _solid(size, center, volume, part="*", rel_tol=0.02):
    return [{"kind": "watertight", "part": part},
            {"kind": "extents", "part": part, "value": list(size)},
            {"kind": "center", "part": part, "value": list(center)},
            {"kind": "volume", "part": part, "value": volume, "rel_tol": rel_tol}]


def box_dims(rng: random.Random) -> GeoProblem:
    x, y, z = half(rng, 0.5, 8), half(rng, 0.5, 8), half(rng, 0.5, 8)
    while y == x:
        y = half(rng, 0.5, 8)
    return GeoProblem(
        prompt=f"Model a box {fmt(x)} long (along x), {fmt(y)} deep (along y) and {fmt(z)} high "
               f"(along z), standing on the ground (its bottom face at z = 0), centred on the z axis.",
        checks=_solid((x, y, z), (0, 0, z / 2), x * y * z),
        oracle=f"b = box({fmt(x)}, {fmt(y)}, {fmt(z)}).translate(0, 0, {fmt(z / 2)})\nsave(b, 'model.json')\ninfo(b)",
        wrong={"swapped": f"save(box({fmt(y)}, {fmt(x)}, {fmt(z)}).translate(0, 0, {fmt(z / 2)}), 'model.json')",
               "not-on-ground": f"save(box({fmt(x)}, {fmt(y)}, {fmt(z)}), 'model.json')"})


def box_volume(rng: random.Random) -> GeoProblem:
    x, y, z = half(rng, 1, 6), half(rng, 1.5, 6), half(rng, 1, 6)  # y = 1 would hide the "one-side" error
    v = x * y * z
    return GeoProblem(
        prompt=f"Model a box with a base of {fmt(x)} (along x) by {fmt(y)} (along y) and a volume of "
               f"{fmt(v)}, standing on the ground (bottom at z = 0), centred on the z axis.",
        checks=_solid((x, y, z), (0, 0, z / 2), v),
        oracle=f"h = {fmt(v)} / ({fmt(x)} * {fmt(y)})\nsave(box({fmt(x)}, {fmt(y)}, h).translate(0, 0, h / 2), 'model.json')",
        wrong={"one-side": f"h = {fmt(v)} / {fmt(x)}\nsave(box({fmt(x)}, {fmt(y)}, h).translate(0, 0, h / 2), 'model.json')"})


def cube_volume(rng: random.Random) -> GeoProblem:
    s = half(rng, 1.5, 9)  # not 1: every power of 1 is 1
    v = s ** 3
    return GeoProblem(
        prompt=f"Model a cube with a volume of {fmt(v)}, centred on the origin.",
        checks=_solid((s, s, s), (0, 0, 0), v),
        oracle=f"s = {fmt(v)} ** (1 / 3)\nsave(box(s, s, s), 'model.json')",
        wrong={"square-root": f"s = {fmt(v)} ** 0.5\nsave(box(s, s, s), 'model.json')",
               "third": f"s = {fmt(v)} / 3\nsave(box(s, s, s), 'model.json')"})


def cylinder_dims(rng: random.Random) -> GeoProblem:
    r, h = half(rng, 0.5, 5), half(rng, 0.5, 10)
    return GeoProblem(
        prompt=f"Model a cylinder of radius {fmt(r)} and height {fmt(h)}, standing upright on the "
               f"ground (bottom at z = 0), its axis on the z axis.",
        checks=_solid((2 * r, 2 * r, h), (0, 0, h / 2), math.pi * r * r * h),
        oracle=f"c = cylinder({fmt(r)}, {fmt(h)}).translate(0, 0, {fmt(h / 2)})\nsave(c, 'model.json')",
        wrong={"diameter": f"save(cylinder({fmt(2 * r)}, {fmt(h)}).translate(0, 0, {fmt(h / 2)}), 'model.json')"})


def cylinder_diameter(rng: random.Random) -> GeoProblem:
    # the radius is the drawn size (whole diameters 1 to 8), as for every round part: a diameter
    # drawn as a size of its own can be twice a radius of the other split (the extents checked)
    d, h = 2 * half(rng, 0.5, 4), half(rng, 0.5, 8)
    return GeoProblem(
        prompt=f"Model a disc (a cylinder) with a diameter of {fmt(d)} and a thickness of {fmt(h)}, "
               f"centred on the origin, its axis along z.",
        checks=_solid((d, d, h), (0, 0, 0), math.pi * d * d / 4 * h),
        oracle=f"save(cylinder({fmt(d)} / 2, {fmt(h)}), 'model.json')",
        wrong={"diameter-as-radius": f"save(cylinder({fmt(d)}, {fmt(h)}), 'model.json')"})


def cylinder_lying(rng: random.Random) -> GeoProblem:
    r = half(rng, 0.5, 3)
    length = 2 * r + half(rng, 1, 7)  # never 2r: a standing cylinder would have the same box
    return GeoProblem(
        prompt=f"Model a log: a cylinder of radius {fmt(r)} and length {fmt(length)} lying on the "
               f"ground with its axis parallel to the x axis, centred at x = 0 and y = 0.",
        checks=_solid((length, 2 * r, 2 * r), (0, 0, r), math.pi * r * r * length),
        oracle=f"log = cylinder({fmt(r)}, {fmt(length)}).rotate(y=90).translate(0, 0, {fmt(r)})\nsave(log, 'model.json')",
        wrong={"standing": f"save(cylinder({fmt(r)}, {fmt(length)}).translate(0, 0, {fmt(length / 2)}), 'model.json')",
               "along-y": f"save(cylinder({fmt(r)}, {fmt(length)}).rotate(x=90).translate(0, 0, {fmt(r)}), 'model.json')"})


def sphere_radius(rng: random.Random) -> GeoProblem:
    r = half(rng, 0.5, 6)
    return GeoProblem(
        prompt=f"Model a ball of radius {fmt(r)} resting on the ground (touching z = 0), centred above "
               f"the origin.",
        checks=_solid((2 * r, 2 * r, 2 * r), (0, 0, r), 4 / 3 * math.pi * r ** 3),
        oracle=f"save(sphere({fmt(r)}).translate(0, 0, {fmt(r)}), 'model.json')",
        wrong={"centred": f"save(sphere({fmt(r)}), 'model.json')",
               "diameter": f"save(sphere({fmt(r / 2)}).translate(0, 0, {fmt(r / 2)}), 'model.json')"})


def sphere_volume(rng: random.Random) -> GeoProblem:
    r = half(rng, 1.5, 5)  # not 1: there r ** 3 == r, and a forgotten cube root would pass
    v = round(4 / 3 * math.pi * r ** 3, 3)
    return GeoProblem(
        prompt=f"Model a sphere with a volume of {fmt(v)}, centred on the origin (an STL file).",
        checks=_solid((2 * r, 2 * r, 2 * r), (0, 0, 0), v) + [{"kind": "parts", "names": ["model"]}],
        oracle=f"import math\nr = (3 * {fmt(v)} / (4 * math.pi)) ** (1 / 3)\nsave(sphere(r), 'model.stl')",
        wrong={"no-cube-root": f"import math\nr = 3 * {fmt(v)} / (4 * math.pi)\nsave(sphere(r), 'model.stl')"},
        file="model.stl")


def cone_dims(rng: random.Random) -> GeoProblem:
    r, h = half(rng, 0.5, 4), half(rng, 1, 8)
    return GeoProblem(
        prompt=f"Model a cone with a base radius of {fmt(r)} and a height of {fmt(h)}: base on the "
               f"ground (z = 0), apex pointing up, axis on the z axis.",
        # an upside-down cone has the same bounding box and volume: the centroid tells them apart
        checks=_solid((2 * r, 2 * r, h), (0, 0, h / 2), math.pi * r * r * h / 3)
        + [{"kind": "centroid", "part": "*", "value": [0, 0, h / 4]}],
        oracle=f"save(cone({fmt(r)}, {fmt(h)}).translate(0, 0, {fmt(h / 2)}), 'model.json')",
        wrong={"cylinder": f"save(cylinder({fmt(r)}, {fmt(h)}).translate(0, 0, {fmt(h / 2)}), 'model.json')",
               "upside-down": f"save(cone({fmt(r)}, {fmt(h)}).rotate(x=180).translate(0, 0, {fmt(h / 2)}), 'model.json')"})


def tube_pipe(rng: random.Random) -> GeoProblem:
    ro = half(rng, 1.5, 5)
    ri = half(rng, max(0.5, ro / 3), ro - 0.5)  # a thin hole would be within the volume tolerance
    h = half(rng, 1, 10)
    return GeoProblem(
        prompt=f"Model a pipe {fmt(h)} long with an outer radius of {fmt(ro)} and an inner radius of "
               f"{fmt(ri)} (a hollow cylinder, open at both ends), standing on the ground, axis on the z axis.",
        checks=_solid((2 * ro, 2 * ro, h), (0, 0, h / 2), math.pi * (ro * ro - ri * ri) * h),
        oracle=f"save(tube({fmt(ro)}, {fmt(ri)}, {fmt(h)}).translate(0, 0, {fmt(h / 2)}), 'model.json')",
        wrong={"solid": f"save(cylinder({fmt(ro)}, {fmt(h)}).translate(0, 0, {fmt(h / 2)}), 'model.json')"})


def box_corner(rng: random.Random) -> GeoProblem:
    x, y, z = half(rng, 0.5, 5), half(rng, 0.5, 5), half(rng, 0.5, 5)
    px, py, pz = half(rng, -5, 5), half(rng, -5, 5), half(rng, 0, 5)
    return GeoProblem(
        prompt=f"Model a box of size {fmt(x)} x {fmt(y)} x {fmt(z)} (along x, y, z) whose corner with the "
               f"smallest coordinates is at ({fmt(px)}, {fmt(py)}, {fmt(pz)}).",
        checks=[{"kind": "bounds", "part": "*", "min": [px, py, pz], "max": [px + x, py + y, pz + z]},
                {"kind": "watertight", "part": "*"}],
        oracle=f"b = box({fmt(x)}, {fmt(y)}, {fmt(z)}).translate({fmt(px + x / 2)}, {fmt(py + y / 2)}, {fmt(pz + z / 2)})\n"
               f"save(b, 'model.json')\ninfo(b)",
        wrong={"centred-there": f"save(box({fmt(x)}, {fmt(y)}, {fmt(z)}).translate({fmt(px)}, {fmt(py)}, {fmt(pz)}), 'model.json')"})


def sphere_at(rng: random.Random) -> GeoProblem:
    r = half(rng, 0.5, 3)
    cx, cy, cz = half(rng, -6, 6), half(rng, -6, 6), half(rng, 3, 8)
    return GeoProblem(
        prompt=f"Model a sphere of radius {fmt(r)} centred at ({fmt(cx)}, {fmt(cy)}, {fmt(cz)}).",
        checks=_solid((2 * r, 2 * r, 2 * r), (cx, cy, cz), 4 / 3 * math.pi * r ** 3),
        oracle=f"save(sphere({fmt(r)}).move_to({fmt(cx)}, {fmt(cy)}, {fmt(cz)}), 'model.json')",
        wrong={"corner-there": f"save(sphere({fmt(r)}).translate({fmt(cx + r)}, {fmt(cy + r)}, {fmt(cz + r)}), 'model.json')"})


def rotated_box(rng: random.Random) -> GeoProblem:
    a, h = half(rng, 1, 6), half(rng, 0.5, 4)
    d = a * math.sqrt(2)
    return GeoProblem(
        prompt=f"Model a square slab {fmt(a)} x {fmt(a)} (along x and y) and {fmt(h)} thick, turned by 45 "
               f"degrees about the vertical (z) axis, lying on the ground (bottom at z = 0), centred on the z axis.",
        checks=_solid((d, d, h), (0, 0, h / 2), a * a * h),
        oracle=f"save(box({fmt(a)}, {fmt(a)}, {fmt(h)}).rotate(z=45).translate(0, 0, {fmt(h / 2)}), 'model.json')",
        wrong={"not-turned": f"save(box({fmt(a)}, {fmt(a)}, {fmt(h)}).translate(0, 0, {fmt(h / 2)}), 'model.json')",
               "tilted": f"save(box({fmt(a)}, {fmt(a)}, {fmt(h)}).rotate(x=45).move_to(0, 0, {fmt(h / 2)}), 'model.json')"})


def ellipsoid(rng: random.Random) -> GeoProblem:
    a, b, c = half(rng, 0.5, 5), half(rng, 0.5, 5), half(rng, 0.5, 5)
    return GeoProblem(
        prompt=f"Model an ellipsoid centred on the origin with semi-axes {fmt(a)} (along x), {fmt(b)} "
               f"(along y) and {fmt(c)} (along z), e.g. by scaling a sphere.",
        checks=_solid((2 * a, 2 * b, 2 * c), (0, 0, 0), 4 / 3 * math.pi * a * b * c),
        oracle=f"save(sphere(1).scale({fmt(a)}, {fmt(b)}, {fmt(c)}), 'model.json')",
        wrong={"diameters": f"save(sphere(1).scale({fmt(2 * a)}, {fmt(2 * b)}, {fmt(2 * c)}), 'model.json')"})


def plate_hole(rng: random.Random) -> GeoProblem:
    x, y, t = half(rng, 3, 10), half(rng, 3, 10), half(rng, 0.5, 2)
    d = half(rng, max(1.0, min(x, y) / 3), min(x, y) - 1)
    return GeoProblem(
        prompt=f"Model a plate {fmt(x)} x {fmt(y)} (along x, y) and {fmt(t)} thick, lying on the ground "
               f"(bottom at z = 0) centred on the z axis, with a round hole of diameter {fmt(d)} "
               f"through its centre (vertically).",
        # the box is exact and the polygonal hole loses 0.16 % of its own volume: a tight
        # tolerance, so that a forgotten hole (a few % of the plate) fails
        checks=_solid((x, y, t), (0, 0, t / 2), x * y * t - math.pi * d * d / 4 * t, rel_tol=0.005),
        oracle=f"plate = box({fmt(x)}, {fmt(y)}, {fmt(t)}) - cylinder({fmt(d / 2)}, {fmt(t * 2)})\n"
               f"save(plate.translate(0, 0, {fmt(t / 2)}), 'model.json')",
        wrong={"no-hole": f"save(box({fmt(x)}, {fmt(y)}, {fmt(t)}).translate(0, 0, {fmt(t / 2)}), 'model.json')",
               "radius": f"save((box({fmt(x)}, {fmt(y)}, {fmt(t)}) - cylinder({fmt(d)}, {fmt(t * 2)}))"
                         f".translate(0, 0, {fmt(t / 2)}), 'model.json')"})


def open_box(rng: random.Random) -> GeoProblem:
    x, y, h = half(rng, 3, 10), half(rng, 3, 10), half(rng, 2, 8)
    t = rng.choice([0.5, 1.0])
    vol = x * y * h - (x - 2 * t) * (y - 2 * t) * (h - t)
    return GeoProblem(
        prompt=f"Model an open-top container: outside {fmt(x)} x {fmt(y)} x {fmt(h)} (along x, y, z), walls "
               f"and bottom {fmt(t)} thick, no lid, standing on the ground centred on the z axis.",
        checks=_solid((x, y, h), (0, 0, h / 2), vol),
        oracle=f"outer = box({fmt(x)}, {fmt(y)}, {fmt(h)}).translate(0, 0, {fmt(h / 2)})\n"
               f"inner = box({fmt(x - 2 * t)}, {fmt(y - 2 * t)}, {fmt(h)}).translate(0, 0, {fmt(t + h / 2)})\n"
               f"save(outer - inner, 'model.json')",
        wrong={"closed": f"outer = box({fmt(x)}, {fmt(y)}, {fmt(h)}).translate(0, 0, {fmt(h / 2)})\n"
                         f"inner = box({fmt(x - 2 * t)}, {fmt(y - 2 * t)}, {fmt(h - 2 * t)}).translate(0, 0, {fmt(h / 2)})\n"
                         f"save(outer - inner, 'model.json')"})


def cup(rng: random.Random) -> GeoProblem:
    r, h = half(rng, 1.5, 5), half(rng, 2, 8)
    t = rng.choice([0.5, 1.0])
    vol = math.pi * r * r * h - math.pi * (r - t) ** 2 * (h - t)
    return GeoProblem(
        prompt=f"Model a cup: a cylinder of outer radius {fmt(r)} and height {fmt(h)} standing on the ground "
               f"(axis on the z axis), hollowed out from the top with a wall and a bottom {fmt(t)} thick.",
        checks=_solid((2 * r, 2 * r, h), (0, 0, h / 2), vol),
        oracle=f"outer = cylinder({fmt(r)}, {fmt(h)}).translate(0, 0, {fmt(h / 2)})\n"
               f"inner = cylinder({fmt(r - t)}, {fmt(h)}).translate(0, 0, {fmt(t + h / 2)})\n"
               f"save(outer - inner, 'model.json')",
        wrong={"no-bottom": f"save(tube({fmt(r)}, {fmt(r - t)}, {fmt(h)}).translate(0, 0, {fmt(h / 2)}), 'model.json')"})


def l_block(rng: random.Random) -> GeoProblem:
    a, b, h = half(rng, 2, 8), half(rng, 2, 8), half(rng, 2, 8)
    t = rng.choice([0.5, 1.0])
    vol = a * b * t + a * t * (h - t)
    return GeoProblem(
        prompt=f"Model an L-shaped bracket as one solid: a base plate {fmt(a)} (x) by {fmt(b)} (y) and "
               f"{fmt(t)} thick lying on the ground, and a wall {fmt(t)} thick along the base's back edge "
               f"(the edge at the largest y), so that the whole bracket is {fmt(h)} high. Centre the "
               f"base on the z axis.",
        checks=_solid((a, b, h), (0, 0, h / 2), vol),
        oracle=f"base = box({fmt(a)}, {fmt(b)}, {fmt(t)}).translate(0, 0, {fmt(t / 2)})\n"
               f"wall = box({fmt(a)}, {fmt(t)}, {fmt(h)}).translate(0, {fmt(b / 2 - t / 2)}, {fmt(h / 2)})\n"
               f"save(base + wall, 'model.json')",
        wrong={"wall-on-top": f"base = box({fmt(a)}, {fmt(b)}, {fmt(t)}).translate(0, 0, {fmt(t / 2)})\n"
                              f"wall = box({fmt(a)}, {fmt(t)}, {fmt(h)}).translate(0, {fmt(b / 2 - t / 2)}, {fmt(t + h / 2)})\n"
                              f"save(base + wall, 'model.json')"})


DOMAINS = (
    ("box.dims", box_dims, "a box of given size on the ground"),
    ("box.volume", box_volume, "a box of given base and volume"),
    ("box.cube-volume", cube_volume, "a cube of given volume"),
    ("cylinder.dims", cylinder_dims, "an upright cylinder"),
    ("cylinder.diameter", cylinder_diameter, "a disc of given diameter"),
    ("cylinder.lying", cylinder_lying, "a cylinder lying along x"),
    ("sphere.radius", sphere_radius, "a sphere resting on the ground"),
    ("sphere.volume", sphere_volume, "a sphere of given volume (STL)"),
    ("cone.dims", cone_dims, "a cone standing on its base"),
    ("tube.pipe", tube_pipe, "a hollow pipe"),
    ("place.box-corner", box_corner, "a box placed by its corner"),
    ("place.sphere-center", sphere_at, "a sphere placed by its centre"),
    ("rotate.slab-45", rotated_box, "a slab turned 45 degrees"),
    ("scale.ellipsoid", ellipsoid, "an ellipsoid from a scaled sphere"),
    ("bool.plate-hole", plate_hole, "a plate with a hole"),
    ("bool.open-box", open_box, "an open-top container"),
    ("bool.cup", cup, "a cup with a bottom"),
    ("bool.l-bracket", l_block, "an L-shaped bracket"),
)

SCRIPT_DOMAINS = ("box.dims", "cylinder.dims", "sphere.radius", "cone.dims", "place.box-corner",
                  "bool.plate-hole")
"""shapes also offered as single-answer script domains (`geometry.script.<name>`)"""
