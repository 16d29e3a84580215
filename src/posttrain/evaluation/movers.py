"""Which domains moved between two evaluations, ranked so that noise does not come first.

With hundreds of domains, sorting by |after - before| puts small domains whose pass rate jumped by
chance at the top, and a chart of all of them is mostly 0 -> 0 bars. Here each domain's change
comes with its confidence interval (`forgetting.domain_deltas`: paired where the tasks match), and
the ranking key is the interval's bound nearest 0 -- how large the change is *at least*, at the
interval's confidence -- then the change itself. Domains that did not move at all are counted,
not listed.

    moves = rank_moves(domain_deltas(before, after))
    moves.gains[:20], moves.drops[:20], moves.unmoved
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


def assured(delta: float, lo: float, hi: float) -> float:
    """The change the interval assures: its bound nearest 0 when it excludes 0, else 0."""
    if lo > 0:
        return lo
    if hi < 0:
        return -hi
    return 0.0


@dataclass
class Moves:
    gains: list[dict[str, Any]] = field(default_factory=list)
    """domains whose pass@1 rose, the most assured first"""
    drops: list[dict[str, Any]] = field(default_factory=list)
    """domains whose pass@1 fell, the most assured first"""
    unmoved: int = 0
    """domains whose pass@1 is exactly the same (0 -> 0 and 1 -> 1 among them)"""

    @property
    def significant(self) -> tuple[int, int]:
        """(significant gains, significant drops)"""
        return (sum(bool(r["significant"]) for r in self.gains),
                sum(bool(r["significant"]) for r in self.drops))


def rank_moves(rows: Mapping[str, Mapping[str, Any]]) -> Moves:
    """`rows`: domain -> {before, after, delta, ci: [lo, hi], significant} (`domain_deltas`)."""
    out = Moves()
    for dom, r in rows.items():
        delta, (lo, hi) = float(r["delta"]), r["ci"]
        if delta == 0:
            out.unmoved += 1
            continue
        row = {"domain": dom, "before": r["before"], "after": r["after"], "delta": delta, "ci": [lo, hi],
               "assured": assured(delta, lo, hi), "significant": bool(r.get("significant", False))}
        (out.gains if delta > 0 else out.drops).append(row)
    for rows_ in (out.gains, out.drops):
        rows_.sort(key=lambda r: (-r["assured"], -abs(r["delta"]), r["domain"]))
    return out
