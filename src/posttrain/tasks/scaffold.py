"""`posttrain init-domain NAME`: write a ready task-family plugin package to start from.

The package passes `posttrain tasks check` as generated, so a newcomer edits working code rather
than assembling the contract (generator, verifier, oracle, negatives, entry point) from the docs:

    posttrain-NAME/
      pyproject.toml          # the `posttrain.families` entry point the registry loads
      README.md               # install, check, what to edit
      posttrain_NAME/__init__.py
      posttrain_NAME/domains.py   # generator, verifier, oracle, negatives, adversaries
      tests/test_NAME.py      # the self-check and the verifier's edge cases, with pytest

The example domains (`NAME.digits.d3`, `NAME.digits.d6`: the sum of the digits of a number) are
deliberately small; their train/eval split is by content (a hash of the number), the way the data
sources split rows, so no eval task is ever a train task.
"""

from __future__ import annotations

import keyword
import re
from pathlib import Path
from string import Template

NAME_PATTERN = r"[a-z][a-z0-9_]{0,39}"
RESERVED = frozenset({"data", "harbor", "verifiers", "plugin", "posttrain", "test", "tests"})
"""names the run-time task sources and the package itself use (beside the installed families)"""


class ScaffoldError(ValueError):
    """A NAME or target directory that cannot be used; the message says which and why."""


def check_name(name: str, taken: set[str] | frozenset[str] = frozenset()) -> None:
    """Refuse a family name that is not a plain identifier or is already used."""
    if not re.fullmatch(NAME_PATTERN, name):
        raise ScaffoldError(f"NAME {name!r}: a family name is lowercase letters, digits and '_', "
                            "starting with a letter, at most 40 characters (e.g. 'mytasks')")
    if keyword.iskeyword(name) or name in RESERVED:
        raise ScaffoldError(f"NAME {name!r}: reserved (a Python keyword or a name posttrain uses); "
                            "pick another")
    if name in taken:
        raise ScaffoldError(f"NAME {name!r}: a task family of that name is already installed "
                            "(see `posttrain tasks list`); pick another")


def write_package(name: str, target: Path, taken: set[str] | frozenset[str] = frozenset()) -> list[Path]:
    """Write the plugin package for family `name` into `target` (created; must be absent or
    empty). Returns the files written, relative to `target`."""
    check_name(name, taken)
    if target.exists() and not target.is_dir():
        raise ScaffoldError(f"{target}: exists and is not a directory")
    if target.is_dir() and any(target.iterdir()):
        raise ScaffoldError(f"{target}: directory is not empty; give a new or empty directory "
                            "(--dir)")
    values = {"family": name, "pkg": f"posttrain_{name}", "dist": f"posttrain-{name.replace('_', '-')}"}
    files = {
        "pyproject.toml": _PYPROJECT,
        "README.md": _README,
        f"posttrain_{name}/__init__.py": _INIT,
        f"posttrain_{name}/domains.py": _DOMAINS,
        f"tests/test_{name}.py": _TEST,
    }
    written = []
    for rel, template in files.items():
        path = target / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(Template(template).substitute(values))
        written.append(Path(rel))
    return written


_PYPROJECT = '''\
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "${dist}"
version = "0.1.0"
description = "posttrain task family '${family}'"
requires-python = ">=3.11"
dependencies = ["posttrain"]

[project.optional-dependencies]
test = ["pytest>=8"]

# How posttrain finds the family: every entry point in this group is a callable returning
# the family's domains; `posttrain tasks list` shows them once the package is installed.
[project.entry-points."posttrain.families"]
${family} = "${pkg}.domains:domains"

[tool.setuptools]
packages = ["${pkg}"]
'''

_README = '''\
# ${dist}

A posttrain task family, `${family}`, written by `posttrain init-domain ${family}`.

    pip install -e .                                 # registers the entry point
    posttrain tasks list --family ${family}
    posttrain tasks check --family ${family}         # oracle passes, negatives and hacks fail
    posttrain tasks show ${family}.digits.d3 --seed 1
    pytest tests                                     # the same check, plus the verifier's edges

Edit `${pkg}/domains.py`: `_generate` makes a task from a seed (the same seed and split
always give the same task), `DigitSumVerifier` grades an answer, `_oracle` solves a task, and
`_negatives` / `_adversaries` are wrong answers the check requires to fail. Train on the family
by naming it in a run config: `[domains] train = ["${family}.*"]`.
'''

_INIT = '''\
"""posttrain task family '${family}': see `${pkg}.domains`."""
'''

_DOMAINS = '''\
"""Task family '${family}': "what is the sum of the digits of N?", at two sizes of N.

Each domain is a seeded generator, a verifier, an oracle and named wrong answers; `domains()` is
the entry point posttrain's registry calls (pyproject.toml, group `posttrain.families`).
"""

from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass

from posttrain.tasks.domain import Domain
from posttrain.values.task import Split, Task, TaskLimits
from posttrain.values.verdict import Verdict
from posttrain.verifiers.base import Outcome, verdict

FAMILY = "${family}"
EVAL_SHARE = 0.2
"""share of the numbers that belong to the eval split"""


def _split_of(number: int) -> Split:
    # By content, not by seed: a number is in one split whatever seed draws it, so eval tasks
    # can never leak into training.
    bucket = int(hashlib.sha256(str(number).encode()).hexdigest()[:8], 16) / 16 ** 8
    return "eval" if bucket < EVAL_SHARE else "train"


@dataclass(frozen=True)
class DigitSumVerifier:
    """Passes iff the answer is exactly the expected integer (surrounding whitespace allowed).

    Strict on format on purpose: "about 12", "12 or 13" and "12.0" all fail, so a policy cannot
    hedge its way to a reward."""

    name: str = "${family}.digit-sum"
    version: str = "1"
    """bump it whenever grading could change: stored verdicts name the version that made them"""
    needs_sandbox: bool = False

    def verify(self, task: Task, outcome: Outcome) -> Verdict:
        text = (outcome.answer or "").strip()
        if not re.fullmatch(r"-?[0-9]{1,12}", text):
            return verdict(self, False, reason="not an integer", answer=text[:80])
        expected = int(task.reference["answer"])
        return verdict(self, int(text) == expected, got=int(text), expected=expected)


VERIFIER = DigitSumVerifier()


def _domain(digits: int) -> Domain:
    name = f"{FAMILY}.digits.d{digits}"
    low, high = 10 ** (digits - 1), 10 ** digits - 1

    def generate(seed: int, split: Split) -> Task:
        rng = random.Random(f"{name}/{split}/{seed}")
        number = rng.randint(low, high)
        while _split_of(number) != split:  # draw until the number belongs to this split
            number = rng.randint(low, high)
        return Task(domain=name, prompt=f"What is the sum of the digits of {number}? "
                                        "Answer with the number only.",
                    reference={"answer": sum(map(int, str(number))), "number": number},
                    split=split, seed=seed, tags=(FAMILY,), limits=TaskLimits(max_tokens=8))

    return Domain(name=name, family=FAMILY, env="single", verifier=VERIFIER, generate=generate,
                  oracle=_oracle, negatives=_negatives, adversaries=_adversaries,
                  description=f"sum of the digits of a {digits}-digit number", tags=(FAMILY,))


def _oracle(task: Task) -> list[str]:
    """The reference solution, as the policy would write it (one action: the answer)."""
    return [str(task.reference["answer"])]


def _negatives(task: Task) -> dict[str, list[str]]:
    """Plausible wrong answers; `tasks check` requires each to fail ('empty' is required)."""
    answer, number = task.reference["answer"], task.reference["number"]
    return {"empty": [""], "off_by_one": [str(answer + 1)], "the_number": [str(number)],
            "digit_count": [str(len(str(number)))]}


def _adversaries(task: Task) -> dict[str, list[str]]:
    """Attempts to pass without solving (beside posttrain's generic ones); each must fail."""
    answer = task.reference["answer"]
    return {"hedge": [f"{answer - 1} {answer} {answer + 1}"], "sentence": [f"The sum is {answer}."],
            "float": [f"{answer}.0"]}


def domains() -> list[Domain]:
    return [_domain(3), _domain(6)]
'''

_TEST = '''\
"""The family passes posttrain's self-check, and its verifier grades the edge cases as meant."""

from __future__ import annotations

import pytest
from posttrain.scheduling.domain_check import check_domains
from posttrain.verifiers.base import Outcome

from ${pkg}.domains import VERIFIER, domains


def test_every_domain_passes_the_self_check():
    report = check_domains(domains(), per_domain=8)
    assert report.ok, [f"{f.domain} {f.kind}: {f.detail}" for f in report.failures]
    assert report.tasks == 8 * len(domains())


def test_generation_is_deterministic_and_splits_are_disjoint():
    for d in domains():
        assert d.task(3, "train") == d.task(3, "train")
        train = {d.task(s, "train").prompt for s in range(100)}
        held_out = {d.task(s, "eval").prompt for s in range(100)}
        assert not train & held_out


@pytest.mark.parametrize("answer, passed", [("12", True), (" 12\\n", True), ("13", False),
                                            ("12.0", False), ("12 or 13", False), ("", False)])
def test_the_verifier(answer, passed):
    task = domains()[0].task(0)
    task = task.model_copy(update={"reference": {**task.reference, "answer": 12}})
    assert VERIFIER.verify(task, Outcome(answer)).passed is passed
'''
