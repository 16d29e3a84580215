"""Building blocks of the terminal family: a problem drawer per domain, one domain builder.

A domain's `draw(rng)` returns a `ShellProblem`: the prompt, the initial workspace, the hidden
expected state (check script + args), the oracle (tool-call turns that really do the job in the
sandbox) and named wrong attempts (each must fail). The split is by content (prompt + files),
or, for a domain whose answers take a handful of values, by its answer (`ShellProblem.split`).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from posttrain.tasks.domain import Domain
from posttrain.tasks.families.common import content_split, draw_in_split
from posttrain.tasks.families.terminal.checks import STATE_CHECK
from posttrain.values.task import Split, Task, TaskLimits
from posttrain.verifiers.script import SCRIPT

LIMITS = TaskLimits(max_turns=10, max_tokens=384, context_tokens=4096, time_s=120.0,
                    command_timeout_s=10.0)


@dataclass(frozen=True)
class ShellProblem:
    prompt: str
    files: dict[str, str]
    args: dict[str, Any]
    """hidden expected state for the check script"""
    oracle: list[str]
    wrong: dict[str, list[str]]
    """named wrong attempts (action lists); 'empty' is added automatically"""
    check: str = STATE_CHECK
    limits: TaskLimits = field(default=LIMITS)
    split: Split | None = None
    """the split the problem belongs to by construction (its answer is one of that split's);
    None: by content (prompt + files)"""


def terminal_domain(name: str, draw: Callable[[random.Random], ShellProblem], description: str,
                    tags: tuple[str, ...] = ()) -> Domain:
    def generate(seed: int, split: Split) -> Task:
        p, _ = draw_in_split(name, split, seed, draw,
                             lambda p: p.split if p.split is not None else content_split(p.prompt, p.files))
        return Task(domain=name, prompt=p.prompt, files=p.files, env="tools", split=split,
                    seed=seed, limits=p.limits, tags=("terminal",) + tags,
                    reference={"oracle": p.oracle, "wrong": p.wrong},
                    verifier={"check": p.check, "args": p.args})

    def negatives(task: Task) -> dict[str, list[str]]:
        return {"empty": ["<submit></submit>"], **task.reference["wrong"]}

    return Domain(name=name, family="terminal", env="tools", verifier=SCRIPT, generate=generate,
                  oracle=lambda task: list(task.reference["oracle"]), negatives=negatives,
                  description=description, tags=("terminal",) + tags)


# --- data helpers --------------------------------------------------------------------------

WORDS = ("alpha", "bravo", "delta", "echo", "golf", "hotel", "india", "kilo", "lima", "mike",
         "oscar", "papa", "quebec", "romeo", "sierra", "tango", "victor", "whiskey", "yankee", "zulu")
LEVELS = ("INFO", "WARN", "ERROR", "DEBUG")


def word(rng: random.Random) -> str:
    return rng.choice(WORDS)


def ident(rng: random.Random, n: int = 6) -> str:
    return "".join(rng.choice("abcdefghjkmnpqrstuvwxyz23456789") for _ in range(n))


def log_lines(rng: random.Random, n: int) -> list[str]:
    out = []
    for i in range(n):
        level = rng.choice(LEVELS)
        msg = " ".join(word(rng) for _ in range(rng.randint(2, 5)))
        if rng.random() < 0.15:  # lowercase look-alikes: a grep must match the exact level
            msg += " " + rng.choice(["warn", "error", "Errors"])
        out.append(f"2024-03-{rng.randint(1, 28):02d} 12:{i % 60:02d}:{rng.randint(0, 59):02d} {level} {msg}")
    return out


def ip(rng: random.Random) -> str:
    return f"10.{rng.randint(0, 3)}.{rng.randint(0, 3)}.{rng.randint(1, 9)}"


def text(lines: list[str]) -> str:
    return "".join(line + "\n" for line in lines)


def submit(answer: Any) -> str:
    return f"<submit>{answer}</submit>"
