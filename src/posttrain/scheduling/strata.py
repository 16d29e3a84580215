"""The order in which a tier's domains go when their fair-share tags tie: stratified by name.

Fair queueing decides *how much* each domain gets; among domains whose virtual times are equal
(every domain at the start of a run, every domain of equal weight at each round of a
samples-mode run, every domain coming back from a block) the order is free, and it decides
what one trainer step holds. Broken by admission order it is the registry's alphabetical order,
so a step of 32 groups out of 300 domains is all `code.*`. Broken by this order it is spread
over the families as the mix is: the names' dotted components form a tree (`math` > `math.add`
> `math.add.d2`), and each node's list interleaves its children's lists evenly, child `c`'s
`i`-th domain at position `(i + u_c) / n_c` of the node's list (`n_c` its domains, `u_c` a
seeded phase), so that any run of `L` consecutive domains holds about `L * n_c / n` of each
child, recursively, and the seed rotates which child takes the seats a step has left over.
"""

from __future__ import annotations

import random
from collections.abc import Iterable

from posttrain.scheduling.work import derive_seed

__all__ = ["stratified_order", "stratified_ranks"]


class _Node:
    __slots__ = ("children", "leaf")

    def __init__(self) -> None:
        self.children: dict[str, _Node] = {}
        self.leaf: str | None = None


def stratified_order(names: Iterable[str], seed: int = 0) -> list[str]:
    """`names` (distinct) interleaved by their dotted components, seeded (see the module)."""
    root = _Node()
    count = 0
    for name in names:
        node = root
        for part in name.split("."):
            node = node.children.setdefault(part, _Node())
        if node.leaf is not None:
            raise ValueError(f"stratified_order: {name!r} is listed twice")
        node.leaf = name
        count += 1
    order = _order(root, "", seed)
    assert len(order) == count
    return order


def stratified_ranks(names: Iterable[str], seed: int = 0) -> dict[str, int]:
    """Each name's place in `stratified_order`."""
    return {name: i for i, name in enumerate(stratified_order(names, seed))}


def _order(node: _Node, path: str, seed: int) -> list[str]:
    parts: list[tuple[str, list[str]]] = []
    if node.leaf is not None:  # a domain named like a prefix of others is a child of its own
        parts.append(("", [node.leaf]))
    for key in sorted(node.children):
        parts.append((key, _order(node.children[key], f"{path}.{key}", seed)))
    if len(parts) == 1:
        return parts[0][1]
    rng = random.Random(derive_seed(seed, "strata", path))
    placed: list[tuple[float, float, str]] = []
    for _, items in parts:
        phase, tie = rng.random(), rng.random()
        n = len(items)
        placed.extend(((i + phase) / n, tie, name) for i, name in enumerate(items))
    placed.sort()
    return [name for _, _, name in placed]
