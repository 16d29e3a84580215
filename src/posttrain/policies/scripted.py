"""Scripted policies: play a domain's oracle, one of its negatives, or given actions.

They make the whole machinery (environments, sandboxes, verifiers, store, scheduler) testable and
smoke-runnable without a model. A scripted policy reads the task from the request's `meta`
(set by `posttrain.rollout.episode.Episode`) and answers turn `meta["turn"]` with the script's
action for that turn; past the end of its script it answers "" (which a tools environment reports
as a parse error, until the turn budget truncates the episode).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable, Sequence

from posttrain.values.generation import Completion, GenerationRequest, PolicyVersion
from posttrain.values.task import Task

if TYPE_CHECKING:
    from posttrain.tasks.domain import Domain

Script = Callable[[Task], Sequence[str]]
DomainLookup = Callable[[str], "Domain"]


class ScriptedPolicy:
    def __init__(self, script: Script, name: str) -> None:
        self.script = script
        self.version = PolicyVersion(name=name)
        self.accepts_images = True
        """a script reads nothing, so it is shown everything (image episodes record their images)"""
        self.max_positions: int | None = None
        """a script has no context to run out of"""
        self._cache: dict[str, Sequence[str]] = {}

    def render(self, request: GenerationRequest) -> None:
        return None  # no tokenizer

    @classmethod
    def oracle(cls, lookup: DomainLookup | None = None) -> "ScriptedPolicy":
        """Plays each task's oracle; `lookup` maps a domain name to its Domain (the registry's
        `get_domain` by default)."""
        find = lookup or _registry_lookup
        return cls(lambda task: find(task.domain).oracle(task), "scripted:oracle")

    @classmethod
    def negative(cls, which: str = "wrong", lookup: DomainLookup | None = None) -> "ScriptedPolicy":
        """Plays the negative named `which`. 'wrong' means the domain's negative of that name or,
        if it has none, its first plausible wrong answer (the first non-'empty' name, sorted)."""
        find = lookup or _registry_lookup

        def script(task: Task) -> Sequence[str]:
            negatives = find(task.domain).negatives(task)
            if which == "wrong" and which not in negatives:
                wrong = sorted(n for n in negatives if n != "empty")
                if wrong:
                    return negatives[wrong[0]]
            if which not in negatives:
                raise ValueError(f"domain {task.domain} has no negative {which!r} "
                                 f"(it has {', '.join(sorted(negatives))})")
            return negatives[which]
        return cls(script, f"scripted:{which}")

    @classmethod
    def named(cls, name: str, lookup: DomainLookup | None = None) -> "ScriptedPolicy":
        """'oracle', 'empty', or the name of any negative ('wrong', ...)."""
        return cls.oracle(lookup) if name == "oracle" else cls.negative(name, lookup)

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        """One completion per request; a script that fails for one request makes that request's
        completion an error (the episode is recorded as an infrastructure error), not the batch's."""
        out = []
        for req in requests:
            t0 = time.perf_counter()
            task = req.meta.get("task")
            if not isinstance(task, Task):
                raise ValueError("a scripted policy needs the Task in request.meta['task'] "
                                 "(requests made by posttrain.rollout.episode.Episode carry it)")
            key = f"{task.key}:{task.hash}"
            try:
                if key not in self._cache:
                    self._cache[key] = list(self.script(task))
            except Exception as e:  # noqa: BLE001 - reported per request
                out.append(Completion(text="", finish_reason="error", error=f"{type(e).__name__}: {e}",
                                      gen_s=time.perf_counter() - t0))
                continue
            actions = self._cache[key]
            turn = int(req.meta.get("turn", 0))
            text = actions[turn] if turn < len(actions) else ""
            out.append(Completion(text=text, finish_reason="stop", gen_s=time.perf_counter() - t0))
        return out


def _registry_lookup(name: str) -> "Domain":
    from posttrain.tasks.registry import get_domain

    return get_domain(name)
