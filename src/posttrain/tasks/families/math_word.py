"""`math.word.<kind>`: multi-step word problems with numeric answers (part of the `math` family).

Each prompt is one line ending in "=" and names the unit or rounding it wants. Answers are
checked by the `numeric` verifier:

* integer answers: `abs_tol` 1e-9 (exact, but "85.0" or "85" both pass);
* answers the prompt asks "to 2 decimals": the reference is the value rounded to 2 decimals and
  `abs_tol` is 0.006, so the unrounded value and any correct rounding pass while an answer one
  cent off (0.01) fails.

`rel_tol` is 0 for all of them: the answers are small enough that an absolute tolerance is the
honest statement of what the prompt asked.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Mapping
from typing import Any

from posttrain.tasks.domain import Domain
from posttrain.tasks.families.common import Problem, single_domain
from posttrain.values.task import canonical_json
from posttrain.verifiers.answer import NUMERIC

NAMES = ("Ann", "Ben", "Cleo", "Dev", "Eva", "Finn", "Gus", "Hana", "Ivo", "Jade", "Kai", "Lena")
ITEMS = ("apples", "pens", "cards", "eggs", "books", "shells", "coins", "stamps")

EXACT_TOL = {"rel_tol": 0.0, "abs_tol": 1e-9}
CENTS_TOL = {"rel_tol": 0.0, "abs_tol": 0.006}


def fmt(x: float) -> str:
    """`x` rounded to 2 decimals, without trailing zeros ("68", "12.5", "115.76")."""
    text = f"{round(x + 0.0, 2):.2f}".rstrip("0").rstrip(".")
    return "0" if text in ("", "-0") else text


def _plus_one(ans: str) -> str:
    return fmt(float(ans) + 1)


def _stock(rng: random.Random) -> Problem:
    who, item = rng.choice(NAMES), rng.choice(ITEMS)
    a, bags, per = rng.randint(2, 60), rng.randint(2, 9), rng.randint(2, 12)
    gone = rng.randint(1, a + bags * per - 1)
    prompt = f"{who} has {a} {item}, buys {bags} bags of {per} and gives away {gone}. {item.capitalize()} left="
    return Problem(prompt, str(a + bags * per - gone), {"a": a, "bags": bags, "per": per, "gone": gone})


def _stock_wrong(d: Mapping[str, Any], ans: str) -> dict[str, str]:
    return {"wrong": _plus_one(ans), "bags_not_multiplied": str(d["a"] + d["bags"] + d["per"] - d["gone"]),
            "gift_ignored": str(d["a"] + d["bags"] * d["per"])}


def _change(rng: random.Random) -> Problem:
    who, item = rng.choice(NAMES), rng.choice(ITEMS)
    qty, price = rng.randint(2, 9), rng.randint(1, 40)
    paid = (qty * price // 10 + 1 + rng.randint(0, 5)) * 10
    prompt = f"{who} buys {qty} {item} at {price} dollars each and pays {paid} dollars. Change in dollars="
    return Problem(prompt, str(paid - qty * price), {"qty": qty, "price": price, "paid": paid})


def _change_wrong(d: Mapping[str, Any], ans: str) -> dict[str, str]:
    return {"wrong": _plus_one(ans), "one_item": str(d["paid"] - d["price"]),
            "cost_instead": str(d["qty"] * d["price"])}


def _distance(rng: random.Random) -> Problem:
    speed, halves = rng.randint(20, 120), rng.randint(1, 16)
    hours = halves / 2
    prompt = f"A car drives {fmt(hours)} hours at {speed} km/h. Distance in km="
    return Problem(prompt, fmt(speed * hours), {"speed": speed, "hours": hours})


def _distance_wrong(d: Mapping[str, Any], ans: str) -> dict[str, str]:
    return {"wrong": _plus_one(ans), "speed_over_time": fmt(d["speed"] / d["hours"]),
            "added": fmt(d["speed"] + d["hours"])}


def _discount(rng: random.Random) -> Problem:
    item = rng.choice(("coat", "lamp", "bike", "desk", "radio", "tent"))
    price, pct = rng.randint(10, 500), rng.choice((5, 10, 15, 20, 25, 30, 35, 40, 50, 60, 75))
    prompt = f"A {price} dollar {item} is {pct}% off. Price in dollars to 2 decimals="
    return Problem(prompt, fmt(price * (100 - pct) / 100), {"price": price, "pct": pct})


def _discount_wrong(d: Mapping[str, Any], ans: str) -> dict[str, str]:
    return {"wrong": fmt(float(ans) + 0.01), "discount_only": fmt(d["price"] * d["pct"] / 100),
            "minus_pct": fmt(d["price"] - d["pct"])}


def _mean(rng: random.Random) -> Problem:
    xs = [rng.randint(40, 100) for _ in range(rng.randint(3, 6))]
    prompt = f"Mean of the scores {', '.join(map(str, xs))} to 2 decimals="
    return Problem(prompt, fmt(sum(xs) / len(xs)), {"xs": xs})


def _mean_wrong(d: Mapping[str, Any], ans: str) -> dict[str, str]:
    xs = d["xs"]
    return {"wrong": fmt(float(ans) + 0.01), "sum": str(sum(xs)),
            "off_by_one_count": fmt(sum(xs) / (len(xs) + 1))}


def _interest(rng: random.Random) -> Problem:
    p, r, n = rng.randint(1, 50) * 100, rng.randint(1, 12), rng.randint(2, 6)
    prompt = f"{p} dollars earn {r}% interest a year, compounded yearly. Balance after {n} years to 2 decimals="
    return Problem(prompt, fmt(p * (1 + r / 100) ** n), {"p": p, "r": r, "n": n})


def _interest_wrong(d: Mapping[str, Any], ans: str) -> dict[str, str]:
    return {"wrong": fmt(float(ans) + 0.01), "simple_interest": fmt(d["p"] * (1 + d["r"] * d["n"] / 100)),
            "one_year_short": fmt(d["p"] * (1 + d["r"] / 100) ** (d["n"] - 1))}


def _workers(rng: random.Random) -> Problem:
    w1, days, w2 = rng.randint(2, 12), rng.randint(2, 30), rng.randint(2, 12)
    walls1, walls2 = rng.randint(1, 6), rng.randint(1, 6)
    prompt = (f"{w1} workers build {walls1} walls in {days} days. Days for {w2} workers to build "
              f"{walls2} walls, to 2 decimals=")
    return Problem(prompt, fmt(days * (walls2 / walls1) * (w1 / w2)),
                   {"w1": w1, "days": days, "w2": w2, "walls1": walls1, "walls2": walls2})


def _workers_wrong(d: Mapping[str, Any], ans: str) -> dict[str, str]:
    return {"wrong": _plus_one(ans),
            "workers_inverted": fmt(d["days"] * (d["walls2"] / d["walls1"]) * (d["w2"] / d["w1"]))}


def _ages(rng: random.Random) -> Problem:
    a, k, y = rng.randint(2, 30), rng.randint(2, 5), rng.randint(1, 20)
    big, small = rng.sample(NAMES, 2)
    total = (k + 1) * a + 2 * y
    prompt = f"{big} is {k} times as old as {small}. In {y} years their ages add up to {total}. {big}'s age="
    return Problem(prompt, str(k * a), {"k": k, "a": a, "y": y})


def _ages_wrong(d: Mapping[str, Any], ans: str) -> dict[str, str]:
    return {"wrong": _plus_one(ans), "younger_age": str(d["a"]), "in_y_years": str(d["k"] * d["a"] + d["y"])}


def _minutes(rng: random.Random) -> Problem:
    h, m = rng.randint(1, 23), rng.randint(1, 59)
    return Problem(f"{h} hours {m} minutes in minutes=", str(60 * h + m), {"h": h, "m": m})


def _minutes_wrong(d: Mapping[str, Any], ans: str) -> dict[str, str]:
    return {"wrong": _plus_one(ans), "hundred_minutes": str(100 * d["h"] + d["m"]),
            "hours_only": str(60 * d["h"])}


def _recipe(rng: random.Random) -> Problem:
    n1, n2, grams = rng.randint(2, 8), rng.randint(2, 12), rng.randint(5, 60) * 10
    ing = rng.choice(("flour", "sugar", "rice", "butter", "oats"))
    prompt = f"A recipe for {n1} people uses {grams} g of {ing}. Grams for {n2} people to 2 decimals="
    return Problem(prompt, fmt(grams * n2 / n1), {"n1": n1, "n2": n2, "grams": grams})


def _recipe_wrong(d: Mapping[str, Any], ans: str) -> dict[str, str]:
    return {"wrong": _plus_one(ans), "inverted": fmt(d["grams"] * d["n1"] / d["n2"]),
            "added_people": str(d["grams"] + d["n2"] - d["n1"])}


# kind -> (draw, wrong answers, tolerance, description)
KINDS: dict[str, tuple[Callable[[random.Random], Problem], Callable, dict, str]] = {
    "stock": (_stock, _stock_wrong, EXACT_TOL, "items left after buying bags and giving some away"),
    "change": (_change, _change_wrong, EXACT_TOL, "change after buying several items"),
    "distance": (_distance, _distance_wrong, EXACT_TOL, "distance from speed and time"),
    "discount": (_discount, _discount_wrong, CENTS_TOL, "price after a percentage discount"),
    "mean": (_mean, _mean_wrong, CENTS_TOL, "mean of a list of scores"),
    "interest": (_interest, _interest_wrong, CENTS_TOL, "compound interest balance"),
    "workers": (_workers, _workers_wrong, CENTS_TOL, "work-rate proportion with two factors"),
    "ages": (_ages, _ages_wrong, EXACT_TOL, "age puzzle solved by a linear equation"),
    "minutes": (_minutes, _minutes_wrong, EXACT_TOL, "hours and minutes to minutes"),
    "recipe": (_recipe, _recipe_wrong, CENTS_TOL, "scale a recipe to more people"),
}


SPLIT_BY: dict[str, tuple[str, ...]] = {"interest": ("r", "n")}
"""kinds whose split goes by some of their numbers only: a principal of 300 or 1300 dollars at the
same rate and term is one short prompt a few characters apart (a near-duplicate to the
contamination guard), so the rate and the term decide the split and the principal is free"""


def _by_numbers(kind: str, draw: Callable[[random.Random], Problem]) -> Callable[[random.Random], Problem]:
    """A word problem is its numbers: who buys it, or which ingredient, does not change it. So
    the train/eval split goes by the numbers (two problems that differ only in their nouns land
    in the same split), or by those `SPLIT_BY` names."""
    def draw_by_numbers(rng: random.Random) -> Problem:
        p = draw(rng)
        keys = SPLIT_BY.get(kind, tuple(p.data))
        return dataclasses.replace(p, identity=f"math.word.{kind}\x00{canonical_json({k: p.data[k] for k in keys})}")
    return draw_by_numbers


def word_domains() -> list[Domain]:
    return [single_domain(f"math.word.{kind}", NUMERIC, _by_numbers(kind, draw), wrong, description=desc,
                          tags=("math", "word"), verifier_settings=tol)
            for kind, (draw, wrong, tol, desc) in KINDS.items()]
