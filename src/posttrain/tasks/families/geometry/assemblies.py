"""Multi-part geometry problems: stacks, furniture, arrays, symmetric assemblies.

Each part is saved under its own name, so checks can relate parts: resting on, touching, not
overlapping, distances between centres, symmetry.
"""

from __future__ import annotations

import math
import random

from posttrain.tasks.families.geometry.common import GeoProblem, fmt, half


def _names_check(names):
    return {"kind": "parts", "names": list(names)}


def stack(rng: random.Random) -> GeoProblem:
    n = rng.randint(2, 4)
    sizes = [(half(rng, 1, 6), half(rng, 1, 6), half(rng, 0.5, 3)) for _ in range(n)]
    names = [f"b{i + 1}" for i in range(n)]

    def build(lift: float) -> str:
        """the tower, each box raised `lift` more than the one below (0: resting)"""
        lines, z = [], 0.0
        for i, (name, (x, y, h)) in enumerate(zip(names, sizes)):
            lines.append(f"{name} = box({fmt(x)}, {fmt(y)}, {fmt(h)}).translate(0, 0, {fmt(z + h / 2 + i * lift)})"
                         f".named('{name}')")
            z += h
        return "\n".join(lines) + f"\nsave([{', '.join(names)}], 'model.json')"

    total = sum(h for _, _, h in sizes)
    desc = "; ".join(f"{nm}: {fmt(x)} x {fmt(y)} x {fmt(h)}" for nm, (x, y, h) in zip(names, sizes))
    checks = [_names_check(names), {"kind": "no_overlap", "parts": "*"},
              {"kind": "rests_on", "a": "b1", "b": "ground"},
              {"kind": "extents", "part": "*", "value": [max(s[0] for s in sizes), max(s[1] for s in sizes), total]},
              {"kind": "symmetric", "part": "*", "axis": "x"}, {"kind": "symmetric", "part": "*", "axis": "y"}]
    checks += [{"kind": "rests_on", "a": names[i], "b": names[i - 1]} for i in range(1, n)]
    all_down = "\n".join(f"{nm} = box({fmt(x)}, {fmt(y)}, {fmt(h)}).translate(0, 0, {fmt(h / 2)}).named('{nm}')"
                         for nm, (x, y, h) in zip(names, sizes))
    return GeoProblem(
        prompt=f"Stack {n} boxes (sizes along x, y, z) into a tower, each one centred on the z axis and "
               f"resting on the one before it, the first on the ground: {desc}. Name them "
               f"{', '.join(names)}.",
        checks=checks, oracle=build(0.0),
        wrong={"gaps": build(0.2), "all-on-ground": all_down + f"\nsave([{', '.join(names)}], 'model.json')"})


def table(rng: random.Random) -> GeoProblem:
    lx, ly, t = half(rng, 4, 12), half(rng, 3, 8), rng.choice([0.5, 1.0])
    height, s = half(rng, 4, 10), rng.choice([0.5, 1.0])
    inset = rng.choice([0.0, 0.5])
    leg_h = height - t
    lines = [f"top = box({fmt(lx)}, {fmt(ly)}, {fmt(t)}).translate(0, 0, {fmt(height - t / 2)}).named('top')"]
    legs = []
    for i, (sx, sy) in enumerate([(1, 1), (-1, 1), (-1, -1), (1, -1)], start=1):
        cx, cy = sx * (lx / 2 - inset - s / 2), sy * (ly / 2 - inset - s / 2)
        lines.append(f"leg{i} = box({fmt(s)}, {fmt(s)}, {fmt(leg_h)}).translate({fmt(cx)}, {fmt(cy)}, {fmt(leg_h / 2)}).named('leg{i}')")
        legs.append(f"leg{i}")
    save = "save([top, leg1, leg2, leg3, leg4], 'table.glb')"
    checks = [_names_check(["top"] + legs), {"kind": "no_overlap", "parts": "*"},
              {"kind": "extents", "part": "*", "value": [lx, ly, height]},
              {"kind": "center", "part": "*", "value": [0, 0, height / 2]}]
    checks += [{"kind": "rests_on", "a": leg, "b": "ground"} for leg in legs]
    checks += [{"kind": "rests_on", "a": "top", "b": leg} for leg in legs]
    full = [ln.replace(f", {fmt(leg_h)}).translate", f", {fmt(height)}).translate").replace(
        f", {fmt(leg_h / 2)}).named", f", {fmt(height / 2)}).named") for ln in lines]
    return GeoProblem(
        prompt=f"Model a table {fmt(height)} high: a top {fmt(lx)} x {fmt(ly)} (along x, y) and {fmt(t)} thick, "
               f"on four square legs {fmt(s)} x {fmt(s)}, one under each corner, "
               + (f"set in {fmt(inset)} from both edges" if inset else "flush with the edges")
               + ", standing on the ground. The table is centred on the z axis. Name the parts top, "
               "leg1, leg2, leg3, leg4 and save a GLB file.",
        checks=checks, oracle="\n".join(lines) + "\n" + save, file="table.glb",
        wrong={"legs-too-long": "\n".join(full) + "\n" + save})


def stool(rng: random.Random) -> GeoProblem:
    rs, t = half(rng, 2, 5), rng.choice([0.5, 1.0])
    height, rl = half(rng, 3, 8), rng.choice([0.25, 0.5])
    # the legs' distance is drawn (a size of the split), not derived: its cos/sin coordinates are
    # most of the reference, so two stools sharing it read as near-duplicates
    rr = half(rng, 1, rs - 0.5)
    leg_h = height - t
    lines = [f"seat = cylinder({fmt(rs)}, {fmt(t)}).translate(0, 0, {fmt(height - t / 2)}).named('seat')"]
    for i, ang in enumerate((90, 210, 330), start=1):
        x, y = rr * math.cos(math.radians(ang)), rr * math.sin(math.radians(ang))
        lines.append(f"leg{i} = cylinder({fmt(rl)}, {fmt(leg_h)}).translate({x!r}, {y!r}, {fmt(leg_h / 2)}).named('leg{i}')")
    save = "save([seat, leg1, leg2, leg3], 'model.json')"
    legs = ["leg1", "leg2", "leg3"]
    checks = [_names_check(["seat"] + legs), {"kind": "no_overlap", "parts": "*"},
              {"kind": "symmetric", "part": "*", "axis": "x"},
              {"kind": "extents", "part": "seat", "value": [2 * rs, 2 * rs, t]},
              {"kind": "distance", "a": "leg1", "b": "leg2", "value": rr * math.sqrt(3)}]
    checks += [{"kind": "rests_on", "a": leg, "b": "ground"} for leg in legs]
    checks += [{"kind": "rests_on", "a": "seat", "b": leg} for leg in legs]
    wrong_lines = [lines[0]]
    for i, ang in enumerate((90, 180, 270), start=1):  # legs at 90-degree steps: not evenly spaced
        x, y = rr * math.cos(math.radians(ang)), rr * math.sin(math.radians(ang))
        wrong_lines.append(f"leg{i} = cylinder({fmt(rl)}, {fmt(leg_h)}).translate({x!r}, {y!r}, {fmt(leg_h / 2)}).named('leg{i}')")
    return GeoProblem(
        prompt=f"Model a stool {fmt(height)} high: a round seat of radius {fmt(rs)} and {fmt(t)} thick on three "
               f"cylindrical legs of radius {fmt(rl)} standing on the ground. The seat's centre is on the z "
               f"axis; the legs' axes are {fmt(rr)} from the z axis, at angles 90, 210 and 330 degrees "
               f"(counter-clockwise from the +x axis, seen from above). Name the parts seat, leg1, leg2, leg3.",
        checks=checks, oracle="\n".join(lines) + "\n" + save,
        wrong={"uneven-legs": "\n".join(wrong_lines) + "\n" + save})


def shelf(rng: random.Random) -> GeoProblem:
    w, d, h = half(rng, 4, 10), half(rng, 2, 5), half(rng, 6, 14)
    t = rng.choice([0.5, 1.0])
    k = rng.randint(2, 4)
    inner = w - 2 * t
    lines = [f"left = box({fmt(t)}, {fmt(d)}, {fmt(h)}).translate({fmt(-w / 2 + t / 2)}, 0, {fmt(h / 2)}).named('left')",
             f"right = box({fmt(t)}, {fmt(d)}, {fmt(h)}).translate({fmt(w / 2 - t / 2)}, 0, {fmt(h / 2)}).named('right')"]
    names = ["left", "right"]
    gap = (h - t) / (k - 1)
    for i in range(k):
        z = t / 2 + i * gap
        lines.append(f"s{i + 1} = box({fmt(inner)}, {fmt(d)}, {fmt(t)}).translate(0, 0, {z!r}).named('s{i + 1}')")
        names.append(f"s{i + 1}")
    save = f"save([{', '.join(names)}], 'model.json')"
    checks = [_names_check(names), {"kind": "no_overlap", "parts": "*"},
              {"kind": "extents", "part": "*", "value": [w, d, h]},
              {"kind": "center", "part": "*", "value": [0, 0, h / 2]},
              {"kind": "bounds", "part": "s1", "min": [-inner / 2, -d / 2, 0], "max": [inner / 2, d / 2, t]},
              {"kind": "bounds", "part": f"s{k}", "min": [-inner / 2, -d / 2, h - t], "max": [inner / 2, d / 2, h]}]
    checks += [{"kind": "contact", "a": f"s{i + 1}", "b": side} for i in range(k) for side in ("left", "right")]
    wide = [ln.replace(f"box({fmt(inner)},", f"box({fmt(w)},") for ln in lines]
    return GeoProblem(
        prompt=f"Model a bookshelf {fmt(w)} wide (x), {fmt(d)} deep (y) and {fmt(h)} high, standing on the ground "
               f"centred on the z axis: two side panels {fmt(t)} thick (named left and right) and {k} shelves "
               f"{fmt(t)} thick (named s1 to s{k}, from the bottom) fitted between the panels, evenly spaced: "
               f"s1 lies on the ground and the top of s{k} is at the top of the panels.",
        checks=checks, oracle="\n".join(lines) + "\n" + save,
        wrong={"shelves-through-panels": "\n".join(wide) + "\n" + save})


def stairs(rng: random.Random) -> GeoProblem:
    n = rng.randint(3, 6)
    w, run, rise = half(rng, 2, 6), half(rng, 0.5, 1.5), rng.choice([0.5, 1.0])  # run: a size of the split
    names = [f"step{i + 1}" for i in range(n)]
    lines = [f"{nm} = box({fmt(w)}, {fmt(run)}, {fmt(rise * (i + 1))}).translate(0, {fmt(run * i + run / 2)}, "
             f"{fmt(rise * (i + 1) / 2)}).named('{nm}')" for i, nm in enumerate(names)]
    floating = [f"{nm} = box({fmt(w)}, {fmt(run)}, {fmt(rise)}).translate(0, {fmt(run * i + run / 2)}, "
                f"{fmt(rise * i + rise / 2)}).named('{nm}')" for i, nm in enumerate(names)]
    save = f"save([{', '.join(names)}], 'model.json')"
    checks = [_names_check(names), {"kind": "no_overlap", "parts": "*"},
              {"kind": "volume", "part": "*", "value": w * run * rise * n * (n + 1) / 2},
              {"kind": "bounds", "part": "*", "min": [-w / 2, 0, 0], "max": [w / 2, n * run, n * rise]}]
    checks += [{"kind": "rests_on", "a": nm, "b": "ground"} for nm in names]
    return GeoProblem(
        prompt=f"Model a solid staircase of {n} steps climbing towards +y: each step is a block {fmt(w)} wide "
               f"(x, centred on x = 0) and {fmt(run)} deep (y) standing on the ground, step i (from 1) is "
               f"{fmt(rise)} * i high and starts at y = {fmt(run)} * (i - 1). Name them step1 to step{n}.",
        checks=checks, oracle="\n".join(lines) + "\n" + save,
        wrong={"floating-steps": "\n".join(floating) + "\n" + save})


def row(rng: random.Random) -> GeoProblem:
    n, r = rng.randint(3, 5), half(rng, 0.5, 2)
    s = 2 * r + half(rng, 0.5, 3)
    names = [f"ball{i + 1}" for i in range(n)]
    lines = [f"{nm} = sphere({fmt(r)}).translate({fmt(i * s)}, 0, {fmt(r)}).named('{nm}')" for i, nm in enumerate(names)]
    gaps = [f"{nm} = sphere({fmt(r)}).translate({fmt(i * (s + 2 * r))}, 0, {fmt(r)}).named('{nm}')"
            for i, nm in enumerate(names)]
    save = f"save([{', '.join(names)}], 'model.json')"
    checks = [_names_check(names), {"kind": "no_overlap", "parts": "*"},
              {"kind": "center", "part": "ball1", "value": [0, 0, r]}]
    checks += [{"kind": "distance", "a": names[i], "b": names[i + 1], "value": s} for i in range(n - 1)]
    checks += [{"kind": "rests_on", "a": nm, "b": "ground"} for nm in names]
    return GeoProblem(
        prompt=f"Model {n} balls of radius {fmt(r)} in a row along the x axis, resting on the ground, their "
               f"centres {fmt(s)} apart (centre to centre), the first centred above the origin. Name them "
               f"ball1 to ball{n}.",
        checks=checks, oracle="\n".join(lines) + "\n" + save,
        wrong={"gap-not-spacing": "\n".join(gaps) + "\n" + save})


def grid(rng: random.Random) -> GeoProblem:
    rows, cols = rng.randint(2, 3), rng.randint(2, 4)
    a, g = half(rng, 0.5, 2), half(rng, 0.5, 2)
    w, d = cols * a + (cols - 1) * g, rows * a + (rows - 1) * g
    parts, lines, touching = [], [], []
    for i in range(rows):
        for j in range(cols):
            nm = f"c{i + 1}{j + 1}"
            x, y = -w / 2 + a / 2 + j * (a + g), -d / 2 + a / 2 + i * (a + g)
            lines.append(f"{nm} = box({fmt(a)}, {fmt(a)}, {fmt(a)}).translate({fmt(x)}, {fmt(y)}, {fmt(a / 2)}).named('{nm}')")
            x2, y2 = -(cols * a) / 2 + a / 2 + j * a, -(rows * a) / 2 + a / 2 + i * a
            touching.append(f"{nm} = box({fmt(a)}, {fmt(a)}, {fmt(a)}).translate({fmt(x2)}, {fmt(y2)}, {fmt(a / 2)}).named('{nm}')")
            parts.append(nm)
    save = f"save([{', '.join(parts)}], 'model.json')"
    checks = [_names_check(parts), {"kind": "no_overlap", "parts": "*"},
              {"kind": "extents", "part": "*", "value": [w, d, a]},
              {"kind": "center", "part": "*", "value": [0, 0, a / 2]},
              {"kind": "distance", "a": "c11", "b": "c12", "value": a + g}]
    return GeoProblem(
        prompt=f"Model a grid of {rows} rows (along y) by {cols} columns (along x) of cubes with {fmt(a)} sides, "
               f"{fmt(g)} apart (the gap between neighbouring cubes), all on the ground, the whole grid centred "
               f"on the z axis. Name the cube in row i and column j c<i><j> (c11 has the smallest x and y).",
        checks=checks, oracle="\n".join(lines) + "\n" + save,
        wrong={"no-gaps": "\n".join(touching) + "\n" + save})


def ring(rng: random.Random) -> GeoProblem:
    n, r, h = rng.randint(4, 8), half(rng, 0.5, 1), half(rng, 2, 6)
    big = half(rng, 3, 8)
    names = [f"p{i + 1}" for i in range(n)]

    def place(k):
        out = []
        for i, nm in enumerate(names):
            ang = 2 * math.pi * i / k
            out.append(f"{nm} = cylinder({fmt(r)}, {fmt(h)}).translate({big * math.cos(ang)!r}, "
                       f"{big * math.sin(ang)!r}, {fmt(h / 2)}).named('{nm}')")
        return out

    save = f"save([{', '.join(names)}], 'model.json')"
    checks = [_names_check(names), {"kind": "no_overlap", "parts": "*"},
              {"kind": "center", "part": "p1", "value": [big, 0, h / 2]},
              {"kind": "symmetric", "part": "*", "axis": "y"}]
    checks += [{"kind": "distance", "a": names[i], "b": names[(i + 1) % n], "value": 2 * big * math.sin(math.pi / n)}
               for i in range(n)]
    return GeoProblem(
        prompt=f"Model a ring of {n} pillars (cylinders of radius {fmt(r)} and height {fmt(h)}, standing on the "
               f"ground) evenly spaced on a circle of radius {fmt(big)} around the z axis, the first (p1) "
               f"centred on the +x axis. Name them p1 to p{n} counter-clockwise.",
        checks=checks, oracle="\n".join(place(n)) + "\n" + save,
        wrong={"uneven": "\n".join(place(n + 1)) + "\n" + save})


def snowman(rng: random.Random) -> GeoProblem:
    r1 = half(rng, 2, 4)
    r2 = half(rng, 1, r1 - 0.5)
    r3 = half(rng, 0.5, r2 - 0.5) if r2 > 1 else 0.5
    z1, z2 = r1, 2 * r1 + r2
    z3 = z2 + r2 + r3
    lines = [f"bottom = sphere({fmt(r1)}).translate(0, 0, {fmt(z1)}).named('bottom')",
             f"middle = sphere({fmt(r2)}).translate(0, 0, {fmt(z2)}).named('middle')",
             f"head = sphere({fmt(r3)}).translate(0, 0, {fmt(z3)}).named('head')"]
    save = "save([bottom, middle, head], 'model.json')"
    checks = [_names_check(["bottom", "middle", "head"]), {"kind": "no_overlap", "parts": "*"},
              {"kind": "rests_on", "a": "bottom", "b": "ground"},
              {"kind": "contact", "a": "middle", "b": "bottom"}, {"kind": "contact", "a": "head", "b": "middle"},
              {"kind": "extents", "part": "*", "value": [2 * r1, 2 * r1, z3 + r3]}]
    sunk = [lines[0], f"middle = sphere({fmt(r2)}).translate(0, 0, {fmt(2 * r1)}).named('middle')",
            f"head = sphere({fmt(r3)}).translate(0, 0, {fmt(2 * r1 + r2)}).named('head')"]
    return GeoProblem(
        prompt=f"Model a snowman of three balls stacked on the z axis: bottom (radius {fmt(r1)}) on the ground, "
               f"middle (radius {fmt(r2)}) resting on it, head (radius {fmt(r3)}) resting on the middle; each "
               f"ball just touches the one below. Name them bottom, middle, head.",
        checks=checks, oracle="\n".join(lines) + "\n" + save,
        wrong={"centres-on-tops": "\n".join(sunk) + "\n" + save})


def tower(rng: random.Random) -> GeoProblem:
    r, h = half(rng, 1, 4), half(rng, 3, 10)
    rr, hr = r + half(rng, 0, 1), half(rng, 1, 4)
    lines = [f"body = cylinder({fmt(r)}, {fmt(h)}).translate(0, 0, {fmt(h / 2)}).named('body')",
             f"roof = cone({fmt(rr)}, {fmt(hr)}).translate(0, 0, {fmt(h + hr / 2)}).named('roof')"]
    save = "save([body, roof], 'model.json')"
    checks = [_names_check(["body", "roof"]), {"kind": "no_overlap", "parts": "*"},
              {"kind": "rests_on", "a": "body", "b": "ground"}, {"kind": "rests_on", "a": "roof", "b": "body"},
              {"kind": "extents", "part": "roof", "value": [2 * rr, 2 * rr, hr]},
              {"kind": "volume", "part": "*", "value": math.pi * (r * r * h + rr * rr * hr / 3)}]
    return GeoProblem(
        prompt=f"Model a tower: a cylindrical body of radius {fmt(r)} and height {fmt(h)} standing on the ground "
               f"(axis on the z axis), with a cone roof of base radius {fmt(rr)} and height {fmt(hr)} sitting on "
               f"top of it. Name them body and roof.",
        checks=checks, oracle="\n".join(lines) + "\n" + save,
        wrong={"roof-inside": lines[0] + f"\nroof = cone({fmt(rr)}, {fmt(hr)}).translate(0, 0, {fmt(h)}).named('roof')\n" + save,
               "diameter": lines[0] + f"\nroof = cone({fmt(2 * rr)}, {fmt(hr)}).translate(0, 0, {fmt(h + hr / 2)}).named('roof')\n" + save})


def dumbbell(rng: random.Random) -> GeoProblem:
    length, rb, big = half(rng, 3, 10), rng.choice([0.25, 0.5]), half(rng, 1, 3)
    lines = [f"bar = cylinder({fmt(rb)}, {fmt(length)}).rotate(y=90).named('bar')",
             f"left = sphere({fmt(big)}).translate({fmt(-length / 2)}, 0, 0).named('left')",
             f"right = sphere({fmt(big)}).translate({fmt(length / 2)}, 0, 0).named('right')"]
    save = "save([bar, left, right], 'model.json')"
    checks = [_names_check(["bar", "left", "right"]), {"kind": "symmetric", "part": "*", "axis": "x"},
              {"kind": "distance", "a": "left", "b": "right", "value": length},
              {"kind": "center", "part": "bar", "value": [0, 0, 0]},
              {"kind": "extents", "part": "*", "value": [length + 2 * big, 2 * big, 2 * big]}]
    outside = [lines[0], f"left = sphere({fmt(big)}).translate({fmt(-length / 2 - big)}, 0, 0).named('left')",
               f"right = sphere({fmt(big)}).translate({fmt(length / 2 + big)}, 0, 0).named('right')"]
    return GeoProblem(
        prompt=f"Model a dumbbell centred on the origin: a bar (cylinder of radius {fmt(rb)} and length "
               f"{fmt(length)}) along the x axis, and two balls of radius {fmt(big)} centred on the bar's two "
               f"ends. Name them bar, left, right (parts may overlap).",
        checks=checks, oracle="\n".join(lines) + "\n" + save,
        wrong={"balls-outside": "\n".join(outside) + "\n" + save})


def bridge(rng: random.Random) -> GeoProblem:
    span, w, h = half(rng, 3, 10), rng.choice([1.0, 1.5, 2.0]), half(rng, 2, 6)
    t, d = rng.choice([0.5, 1.0]), half(rng, 1, 3)
    beam_len = span + 2 * w
    lines = [f"p1 = box({fmt(w)}, {fmt(d)}, {fmt(h)}).translate({fmt(-span / 2 - w / 2)}, 0, {fmt(h / 2)}).named('p1')",
             f"p2 = box({fmt(w)}, {fmt(d)}, {fmt(h)}).translate({fmt(span / 2 + w / 2)}, 0, {fmt(h / 2)}).named('p2')",
             f"beam = box({fmt(beam_len)}, {fmt(d)}, {fmt(t)}).translate(0, 0, {fmt(h + t / 2)}).named('beam')"]
    save = "save([p1, p2, beam], 'model.json')"
    checks = [_names_check(["p1", "p2", "beam"]), {"kind": "no_overlap", "parts": "*"},
              {"kind": "rests_on", "a": "p1", "b": "ground"}, {"kind": "rests_on", "a": "p2", "b": "ground"},
              {"kind": "rests_on", "a": "beam", "b": "p1"}, {"kind": "rests_on", "a": "beam", "b": "p2"},
              {"kind": "extents", "part": "*", "value": [beam_len, d, h + t]},
              {"kind": "symmetric", "part": "*", "axis": "x"}]
    short = lines[:2] + [f"beam = box({fmt(span)}, {fmt(d)}, {fmt(t)}).translate(0, 0, {fmt(h + t / 2)}).named('beam')"]
    return GeoProblem(
        prompt=f"Model a bridge: two pillars {fmt(w)} x {fmt(d)} x {fmt(h)} (x, y, z) standing on the ground with "
               f"a clear span of {fmt(span)} between their inner faces, symmetric about x = 0 and centred on "
               f"y = 0, and a beam {fmt(t)} thick and {fmt(d)} deep lying on both pillars and exactly as long as "
               f"the pillars' outer faces are apart. Name them p1 (at negative x), p2 and beam.",
        checks=checks, oracle="\n".join(lines) + "\n" + save,
        wrong={"beam-spans-gap-only": "\n".join(short) + "\n" + save})


def mirrored(rng: random.Random) -> GeoProblem:
    r, h, off = half(rng, 0.5, 2), half(rng, 1, 4), half(rng, 0.5, 3)
    right = (f"right = cone({fmt(r)}, {fmt(h)}).rotate(y=90).translate({fmt(off + h / 2)}, 0, {fmt(r)}).named('right')")
    lines = [right, "left = right.mirror('x').named('left')"]
    save = "save([left, right], 'model.json')"
    checks = [_names_check(["left", "right"]), {"kind": "no_overlap", "parts": "*"},
              {"kind": "symmetric", "part": "*", "axis": "x"},
              {"kind": "bounds", "part": "right", "min": [off, -r, 0], "max": [off + h, r, 2 * r]},
              {"kind": "centroid", "part": "right", "value": [off + h / 4, 0, r]}]
    copy = [right, f"left = right.translate({fmt(-2 * off - h)}, 0, 0).named('left')"]
    return GeoProblem(
        prompt=f"Model a cone of base radius {fmt(r)} and height {fmt(h)} lying on the ground with its axis along "
               f"x: its base at x = {fmt(off)}, its apex pointing towards +x (named right); and its mirror "
               f"image across the plane x = 0 (named left).",
        checks=checks, oracle="\n".join(lines) + "\n" + save,
        wrong={"translated-copy": "\n".join(copy) + "\n" + save})


DOMAINS = (
    ("stack.boxes", stack, "a tower of stacked boxes"),
    ("furniture.table", table, "a table with four legs (GLB)"),
    ("furniture.stool", stool, "a three-legged stool"),
    ("furniture.shelf", shelf, "a bookshelf with evenly spaced shelves"),
    ("stack.stairs", stairs, "a staircase"),
    ("array.row", row, "balls in a row at a given spacing"),
    ("array.grid", grid, "a grid of cubes with gaps"),
    ("array.ring", ring, "pillars evenly spaced on a circle"),
    ("stack.snowman", snowman, "three touching balls"),
    ("stack.tower", tower, "a cylinder with a cone roof"),
    ("symmetry.dumbbell", dumbbell, "a symmetric dumbbell"),
    ("stack.bridge", bridge, "a beam resting on two pillars"),
    ("symmetry.mirror", mirrored, "a part and its mirror image"),
)
