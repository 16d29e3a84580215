"""The house's import rules, checked on the source: the package graph is a DAG and the layers
only import downwards (see the design notes' "Import rules").

Every import counts, wherever it is written: module level, inside a function, under
`TYPE_CHECKING`, or as `importlib.import_module("posttrain....")` with a literal name. A lazy
import hides a dependency from the reader, not from the architecture.
"""

from __future__ import annotations

import ast
import functools
from collections import defaultdict
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "posttrain"

# What each package must not know. A package not named here may import what the DAG allows.
FORBIDDEN: dict[str, set[str]] = {
    "values": {"*"},  # the floor: no other posttrain package
    "sandbox": {"*"},
    "tasks": {"envs", "policies", "rollout", "scheduling", "storage", "training", "evaluation",
              "pipeline"},
    "verifiers": {"envs", "policies", "rollout", "scheduling", "storage", "training", "evaluation",
                  "pipeline"},
    "policies": {"tasks", "envs", "rollout", "scheduling", "storage", "training", "evaluation",
                 "pipeline"},
    "envs": {"policies", "rollout", "scheduling", "storage", "training", "evaluation", "pipeline"},
    "rollout": {"scheduling", "training", "evaluation", "pipeline"},
    "storage": {"rollout", "scheduling", "training", "evaluation", "pipeline", "envs", "policies"},
    "scheduling": {"training", "evaluation", "pipeline"},
    # the trainer turns trajectories into versions; it drives no episodes (one engine does)
    "training": {"evaluation", "pipeline", "envs", "rollout"},
    "evaluation": {"training", "pipeline"},
}

# Known violations, each removed by a change under way. An entry is (importing file, imported
# package). The test fails when an entry no longer happens, so this list only shrinks.
ALLOWED: dict[tuple[str, str], str] = {}


def _module_name(path: Path, src: Path) -> str:
    rel = path.relative_to(src.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path, src: Path) -> set[str]:
    """Every posttrain module `path` names in an import, resolved to absolute dotted names."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = _module_name(path, src).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            found.add(module)
            # `from posttrain.x import y` may name a submodule y
            found.update(f"{module}.{a.name}" for a in node.names)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "import_module" and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            found.add(node.args[0].value)
    return {m for m in found if m == "posttrain" or m.startswith("posttrain.")}


def _files(src: Path) -> dict[str, Path]:
    return {_module_name(p, src): p for p in sorted(src.rglob("*.py"))}


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


@functools.cache
def module_graph(src: Path = SRC) -> dict[str, set[str]]:
    """module -> the posttrain modules it imports (only names that are modules of ours)."""
    files = _files(src)
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        graph[name] = {m for m in _imports(path, src) if m in files and m != name}
    return graph


def package_edges(src: Path = SRC) -> dict[tuple[str, str], set[str]]:
    """(package, imported package) -> the files (relative to src/posttrain) behind the edge."""
    files = _files(src)
    edges: dict[tuple[str, str], set[str]] = defaultdict(set)
    for name, targets in module_graph(src).items():
        pkg = _package(name)
        rel = str(files[name].relative_to(src))
        for t in targets:
            dst = _package(t)
            if dst != pkg and dst:
                edges[(pkg, dst)].add(rel)
    return edges


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def _edge_report(edges: dict[tuple[str, str], set[str]], pairs: list[tuple[str, str]]) -> str:
    return "\n".join(f"  {a} -> {b}: {sorted(edges[(a, b)])}" for a, b in pairs)


def test_package_graph_is_a_dag():
    edges = package_edges()
    graph: dict[str, set[str]] = defaultdict(set)
    for (a, b), files in edges.items():
        if any((f, b) not in ALLOWED for f in files):
            graph[a].add(b)
    cycles = _cycles(graph)
    detail = [_edge_report(edges, [(a, b) for a in c for b in c if (a, b) in edges]) for c in cycles]
    assert not cycles, "package cycles:\n" + "\n".join(detail)


def test_module_graph_has_no_cycles():
    """No two files import each other, directly or round about (a package's `__init__` that
    re-exports its own modules is part of the package, not a cycle)."""
    # a module importing names from its own package's __init__ (or an __init__ importing its own
    # submodules) is re-exporting, not depending
    graph = {name: {t for t in targets if not (name.startswith(t + ".") or t.startswith(name + "."))}
             for name, targets in module_graph(SRC).items()}
    assert not _cycles(graph), f"module cycles: {_cycles(graph)}"


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_layer_rules(package):
    edges = package_edges()
    forbidden = FORBIDDEN[package]
    bad = []
    for (a, b), files in sorted(edges.items()):
        if a != package or ("*" not in forbidden and b not in forbidden):
            continue
        for f in sorted(files):
            if (f, b) not in ALLOWED:
                bad.append(f"  {f} imports posttrain.{b}")
    assert not bad, f"{package} must not import {sorted(forbidden)}:\n" + "\n".join(bad)


def _is_cli(path: Path) -> bool:
    """The command layer: `cli.py`, or `<what>_cli.py` beside it (`runs_cli.py`)."""
    return path.name == "cli.py" or path.name.endswith("_cli.py")


def test_no_library_module_imports_a_cli_module():
    files = _files(SRC)
    bad = []
    for name, targets in module_graph(SRC).items():
        if _is_cli(files[name]):
            continue  # the command layer may mount the sub-commands
        bad += [f"  {name} imports {t}" for t in sorted(targets) if _is_cli(files[t])]
    assert not bad, "library modules importing CLI modules:\n" + "\n".join(bad)


def test_allow_list_only_shrinks():
    """Each allowed violation must still exist: once a change removes it, drop it from ALLOWED."""
    edges = package_edges()
    gone = [f"  {f} -> {p} ({why})" for (f, p), why in ALLOWED.items()
            if f not in edges.get((f.split("/")[0], p), set())]
    assert not gone, "these allowed edges no longer exist; remove them from ALLOWED:\n" + "\n".join(gone)


def test_the_checker_sees_every_kind_of_import(tmp_path):
    """Function-local, TYPE_CHECKING, relative and import_module imports are all edges."""
    pkg = tmp_path / "posttrain"
    (pkg / "a").mkdir(parents=True)
    (pkg / "b").mkdir()
    (pkg / "c").mkdir()
    for d in (pkg, pkg / "a", pkg / "b", pkg / "c"):
        (d / "__init__.py").write_text("")
    (pkg / "b" / "x.py").write_text("")
    (pkg / "c" / "y.py").write_text("")
    (pkg / "a" / "one.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from posttrain.b.x import X\n"
        "def f():\n    import importlib\n    importlib.import_module('posttrain.c.y')\n")
    (pkg / "a" / "two.py").write_text("def g():\n    from ..b import x\n    from . import one\n")
    edges = package_edges(pkg)
    assert edges[("a", "b")] == {"a/one.py", "a/two.py"}
    assert edges[("a", "c")] == {"a/one.py"}
    assert _cycles({"p": {"q"}, "q": {"r"}, "r": {"p"}, "s": {"p"}}) == [["p", "q", "r"]]
