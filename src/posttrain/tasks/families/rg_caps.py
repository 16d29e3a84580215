"""Measuring reasoning-gym's answer caps and answer strata (`reasoning_gym.ANSWER_CAPS_FILE`).

    python -m posttrain.tasks.families.rg_caps     # once per reasoning-gym version (~10 min)

* caps: a generator whose commonest answer is more than CAP_TARGET_EXCESS above uniform gets a
  cap c, and the task draw keeps an item whose answer has share p > c with probability c / p;
* strata: after the caps, a generator whose probed train and eval draws hold the answers they
  share in measurably different shares (`common.split_skew` below SKEW_P on STRATA_PROBE_ITEMS
  draws: a few problems drawn very often, placed by the hash on one side) gets answer strata,
  and its task draw picks the answer class first (`common.strata_of`), the named answers'
  shares flattened like the caps. Only those: a stratified draw costs ~5 draws per answer
  class, and some generators take 60 ms an item.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from typing import Any

from posttrain.tasks.families import reasoning_gym as rg
from posttrain.tasks.families.common import OTHER, Strata, probe_answers, split_skew, strata_of
from posttrain.tasks.guess import SPLIT_SKEW_P

CAP_PROBE_ITEMS = 400
"""items of a generator (keys from a fixed RNG) its answer shares are measured on"""
CAP_TARGET_EXCESS = 0.05
"""the cap makes the commonest answer's share at most this far above 1 / the distinct answers
(half `posttrain.tasks.guess.GUESS_EXCESS_LIMIT`: room for a sample's noise)"""
STRATA_PROBE_ITEMS = 1_000
"""draws (after the caps) the split skew and the strata are measured on"""
SKEW_P = SPLIT_SKEW_P
"""a generator whose splits differ at this p-value (where `tasks check` warns) gets strata (~95
generators tested: about 0.1 false alarm expected, which costs only speed)"""


def answer_caps(name: str, items: int = CAP_PROBE_ITEMS) -> dict[str, Any] | None:
    """{"cap": c, "shares": {answer: share above c}} for a skewed generator, None for one whose
    commonest answer is within CAP_TARGET_EXCESS of uniform. The shares are measured on `items`
    items; the cap is the largest c (by bisection) whose thinned mix meets the target."""
    rng = random.Random(f"rg-answer-caps/{name}")
    answers: dict[str, int] = {}
    for _ in range(items):
        a = rg._oracle_answer(name, rg._item(name, rng.randrange(2 ** 31))).strip()
        answers[a] = answers.get(a, 0) + 1
    shares = {a: n / items for a, n in answers.items()}
    target = 1 / len(shares) + CAP_TARGET_EXCESS
    if max(shares.values()) <= target:
        return None
    cap = _cap(shares, set(shares), target)
    return {"cap": round(cap, 6), "shares": {a: p for a, p in sorted(shares.items()) if p > cap}}


def _cap(shares: Mapping[Any, float], capped: set, target: float) -> float:
    """The largest c (by bisection) with which min(p, c) for the `capped` keys (the others kept),
    renormalised, leaves no capped key above `target`."""
    def top(c: float) -> float:
        return c / sum(min(p, c) if k in capped else p for k, p in shares.items())

    lo, hi = 0.0, max(shares[k] for k in capped)
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if top(mid) <= target else (lo, mid)
    return lo


def answer_strata(name: str, items: int = STRATA_PROBE_ITEMS) -> tuple[dict[str, Any] | None, float]:
    """(the strata as JSON or None, the split-skew p-value) of a generator, its caps applied
    (the shipped ones: measure the caps first)."""
    drawn = probe_answers(f"rg.{name}", rg.thinned_draw(name), lambda d: rg.item_split(name, d),
                          lambda d: rg.drawn_answer(name, d), items)
    p = split_skew(drawn)
    strata = strata_of(drawn) if p < SKEW_P else None
    if strata is None:
        return None, p
    # the split-free probe weighs the eval side's heavy problems as they fall (self_reference's
    # "1" is 29% of all draws, 21% of train ones): the named answers are flattened as the caps
    # do, or stratifying would make the constant answer pay more in training than before
    answers = {a for a in strata.shares if a is not OTHER}
    target = 1 / len({a for a, _ in drawn}) + CAP_TARGET_EXCESS
    if max(strata.shares[a] for a in answers) > target:
        cap = _cap(strata.shares, answers, target)
        flat = {a: min(v, cap) if a in answers else v for a, v in strata.shares.items()}
        total = sum(flat.values())
        strata = Strata(shares={a: round(v / total, 6) for a, v in flat.items()}, splits=strata.splits)
    return strata.to_json(), p


def write_table() -> None:
    """Measure every generator's caps, write them, then its strata under those caps."""
    caps = {}
    for name in rg._generator_names():
        found = answer_caps(name)
        if found is not None:
            caps[name] = found
            print(f"{name}: cap {found['cap']:.3f}, thinned {sorted(found['shares'])[:5]}", flush=True)
    table: dict[str, Any] = {"reasoning_gym": rg.RG_VERSION, "probe_items": CAP_PROBE_ITEMS,
                             "target_excess": CAP_TARGET_EXCESS, "caps": caps,
                             "strata_probe_items": STRATA_PROBE_ITEMS, "skew_p": SKEW_P, "strata": {}}
    rg.ANSWER_CAPS_FILE.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    rg._shipped_table.cache_clear()
    for name in rg._generator_names():
        strata, p = answer_strata(name)
        if strata is not None:
            table["strata"][name] = strata
            print(f"{name}: splits differ (p = {p:.1e}): {len(strata['classes'])} answer classes", flush=True)
    rg.ANSWER_CAPS_FILE.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    rg._shipped_table.cache_clear()
    rg._shipped_strata.cache_clear()


if __name__ == "__main__":
    write_table()
