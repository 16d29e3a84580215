"""The turns a scripted policy plays for one task: the domain's oracle or one of its negatives.

The engine calls `script_for` when it resolves a group's task, and hands the result to the
policy (`posttrain.policies.base.ScriptedPlayer.assign`), so the policy never sees the task.
"""

from __future__ import annotations

from collections.abc import Sequence

from posttrain.tasks.domain import Domain
from posttrain.values.task import Task


def script_for(role: str, domain: Domain, task: Task) -> Sequence[str]:
    """'oracle': the domain's oracle. 'wrong': the domain's negative of that name or, if it has
    none, its first plausible wrong answer (the first non-'empty' name, sorted). Any other name:
    that negative; a domain without it raises ValueError naming the ones it has."""
    if role == "oracle":
        return list(domain.oracle(task))
    negatives = domain.negatives(task)
    if role == "wrong" and role not in negatives:
        wrong = sorted(n for n in negatives if n != "empty")
        if wrong:
            return list(negatives[wrong[0]])
    if role not in negatives:
        raise ValueError(f"domain {task.domain} has no negative {role!r} "
                         f"(it has {', '.join(sorted(negatives))})")
    return list(negatives[role])
