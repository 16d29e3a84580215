"""Scripted policies: play a domain's oracle, one of its negatives, or given actions.

They make the whole machinery (environments, sandboxes, verifiers, store, engine) testable and
smoke-runnable without a model. A scripted policy never sees a task (policies know nothing of
tasks): the engine computes the turns its `role` names for each episode group and hands them
over with `assign(group_id, {role: actions})` (see `posttrain.policies.base.ScriptedPlayer`). A request
is answered from its group's script at turn `meta["turn"]`; past the end of the script it
answers "" (which a tools environment reports as a parse error, until the turn budget truncates
the episode). A request of a group with no script gets an error completion (that episode is an
infrastructure error), not the batch.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence

from posttrain.values.generation import Completion, GenerationRequest, PolicyVersion

MAX_SCRIPTS = 100_000
"""scripts kept (least recently assigned dropped first): a long run assigns one per group"""


class ScriptedPolicy:
    def __init__(self, role: str, name: str | None = None, fixed: Sequence[str] | None = None) -> None:
        """`role`: 'oracle', or the name of a negative ('empty', 'wrong', ...; 'wrong' is the
        domain's negative of that name or else its first plausible wrong answer). `fixed`: play
        these actions in every episode instead (the role is then only a name)."""
        if not role:
            raise ValueError("ScriptedPolicy: role must name the oracle or a negative")
        self.role = role
        self.roles: tuple[str, ...] = (role,) if fixed is None else ()
        self._fixed = tuple(fixed) if fixed is not None else None
        self._given = False
        """scripts were given up front (`by_group`): the engine's are not wanted"""
        self.version = PolicyVersion(name=name or f"scripted:{role}")
        self.accepts_images = True
        """a script reads nothing, so it is shown everything (image episodes record their images)"""
        self.max_positions: int | None = None
        """a script has no context to run out of"""
        self._scripts: OrderedDict[str, tuple[str, ...] | str] = OrderedDict()
        """group id -> its turns, or why it has none"""
        self._lock = threading.Lock()

    def render(self, request: GenerationRequest) -> None:
        return None  # no tokenizer

    @classmethod
    def oracle(cls) -> ScriptedPolicy:
        return cls("oracle")

    @classmethod
    def negative(cls, which: str = "wrong") -> ScriptedPolicy:
        return cls(which)

    @classmethod
    def playing(cls, actions: Sequence[str], name: str = "scripted:fixed") -> ScriptedPolicy:
        """Plays `actions` in every episode, whatever its task (tests, smoke runs)."""
        return cls("fixed", name, fixed=actions)

    @classmethod
    def by_group(cls, scripts: Mapping[str, Sequence[str]], name: str = "scripted:given") -> ScriptedPolicy:
        """Plays `scripts[group_id]` in the episodes of each group (e.g. work items whose group
        ids the caller chose); a group without one gets error completions."""
        policy = cls("given", name)
        policy.roles, policy._given = (), True
        for route, actions in scripts.items():
            policy._put(route, tuple(actions))
        return policy

    @classmethod
    def named(cls, name: str) -> ScriptedPolicy:
        """'oracle', 'empty', or the name of any negative ('wrong', ...)."""
        return cls(name)

    def assign(self, route: str, scripts: Mapping[str, Sequence[str]]) -> None:
        if self._fixed is None and not self._given:
            self._put(route, tuple(scripts[self.role]))

    def refuse(self, route: str, reason: str) -> None:
        self._put(route, reason)

    def _put(self, route: str, script: tuple[str, ...] | str) -> None:
        with self._lock:
            self._scripts[route] = script
            self._scripts.move_to_end(route)
            while len(self._scripts) > MAX_SCRIPTS:
                self._scripts.popitem(last=False)

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        """One completion per request; a request without a script gets an error completion (the
        episode is recorded as an infrastructure error), not the batch."""
        out = []
        for req in requests:
            t0 = time.perf_counter()
            route = str(req.meta.get("group_id", ""))
            with self._lock:
                actions = self._scripts.get(route, self._fixed)
            if not isinstance(actions, tuple):
                why = actions or f"no script assigned for group {route!r} (the engine assigns one per group)"
                out.append(Completion(text="", finish_reason="error", gen_s=time.perf_counter() - t0,
                                      error=f"scripted policy {self.version.name}: {why}"))
                continue
            turn = int(req.meta.get("turn", 0))
            text = actions[turn] if turn < len(actions) else ""
            out.append(Completion(text=text, finish_reason="stop", gen_s=time.perf_counter() - t0))
        return out
