"""How fairly a domain's first N eval seeds sample its answers: for every domain whose draws are
answer-stratified (`posttrain.tasks.families.common.strata_of`; the math and text domains with
frequent answers, and reasoning-gym's stratified generators), the largest gap, in tasks, between
an answer class's count among eval seeds 0..N-1 and N x its share.

    .venv/bin/python benchmarks/eval_strata.py [--n 4,10,20]

Prints a table (one row per N) and a final JSON line. Deterministic (no timing): the classes are
recorded as the tasks are generated.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from typing import Any

from posttrain.tasks.families import common, reasoning_gym
from posttrain.tasks.registry import get_domain, match_domains


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", default="4,10,20", help="comma-separated eval-set sizes")
    args = ap.parse_args()
    seen: dict[tuple[str, str, int], tuple[Any, common.Strata]] = {}
    draw_in_split = common.draw_in_split

    def recording(domain: str, split: Any, seed: int, draw: Any, split_of: Any, strata: Any = None,
                  answer_of: Any = None) -> Any:
        item, rng = draw_in_split(domain, split, seed, draw, split_of, strata, answer_of)
        if strata is not None:
            seen[(domain, split, seed)] = (strata.of(answer_of(item)), strata)
        return item, rng

    common.draw_in_split = recording  # type: ignore[assignment]
    reasoning_gym.draw_in_split = recording  # type: ignore[assignment]
    names = [d.name for d in match_domains("math.*,text.*") if d.env == "single"]
    names += [f"rg.{n}" for n in reasoning_gym._shipped_strata()]  # the generators stratified
    results: dict[int, dict[str, float]] = {}
    for n in (int(x) for x in args.n.split(",")):
        gaps = []
        for name in names:
            domain = get_domain(name)
            for seed in range(n):
                domain.task(seed, "eval")
            got = [seen[(name, "eval", s)] for s in range(n) if (name, "eval", s) in seen]
            if len(got) < n:  # not stratified
                continue
            classes, weights = got[0][1].classes("eval")
            counts = Counter(c for c, _ in got)
            gaps.append(max(abs(counts[c] - n * w / sum(weights)) for c, w in zip(classes, weights)))
        results[n] = {"domains": len(gaps), "mean_gap": round(sum(gaps) / len(gaps), 2),
                      "max_gap": round(max(gaps), 2), "share_gap_ge_2": round(sum(g >= 2 for g in gaps) / len(gaps), 3)}
    print(f"{'N':>4} {'domains':>7} {'mean gap':>9} {'max gap':>8} {'gap>=2':>7}")
    for n, r in results.items():
        print(f"{n:>4} {r['domains']:>7} {r['mean_gap']:>9} {r['max_gap']:>8} {r['share_gap_ge_2']:>7}")
    print(json.dumps({"eval_sizes": results}))


if __name__ == "__main__":
    main()
