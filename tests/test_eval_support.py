"""Helpers shared by the evaluation tests (no tests here): seeded coin-flip policies, toy domains
put into the registry, and synthetic trajectories."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

from posttrain.tasks.domain import Domain
from posttrain.values.generation import Completion, GenerationRequest, PolicyVersion
from posttrain.values.trajectory import ErrorInfo, Trajectory, Turn
from posttrain.values.verdict import Verdict


class CoinPolicy:
    """Answers a task's oracle with probability p (per domain), else its 'wrong' negative.

    The coin is drawn from the request's sampling seed alone, so results depend only on the seeds
    the evaluator assigns: that is what makes runs reproducible and A/B pairs identical."""

    def __init__(self, p: float | Mapping[str, float], name: str = "coin", lookup=None) -> None:
        self.p = p
        self.version = PolicyVersion(name=name)
        self.lookup = lookup
        self.seeds: list[int | None] = []

    def _domain(self, name: str) -> Domain:
        if self.lookup is not None:
            return self.lookup(name)
        from posttrain.tasks.registry import get_domain

        return get_domain(name)

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        out = []
        for req in requests:
            task = req.meta["task"]
            self.seeds.append(req.sampling.seed)
            p = self.p if isinstance(self.p, float) else self.p.get(task.domain, 0.5)
            domain = self._domain(task.domain)
            good = random.Random(req.sampling.seed).random() < p
            actions = domain.oracle(task) if good else domain.negatives(task)["wrong"]
            out.append(Completion(text=actions[0], finish_reason="stop"))
        return out




def tool_trajectory(passed: bool | None, results: Sequence[Sequence[bool]], *, domain: str = "toy.tools",
                    task_hash: str = "h", prompt_ids: bool = False) -> Trajectory:
    """A synthetic tools-environment trajectory: one turn per entry of `results` (the ok flag of
    each bash run of that turn), ending in a submit; `passed=None` makes it an infra_error."""
    turns = []
    for i, oks in enumerate(results):
        turns.append(Turn(index=i, observation="obs" * 10, action="<bash>make test</bash>",
                          prompt_token_ids=list(range(12)) if prompt_ids else None,
                          token_ids=[1, 2, 3] if prompt_ids else None,
                          tool_results=[{"name": "bash", "ok": ok} for ok in oks]))
    turns.append(Turn(index=len(results), observation="done", action="<submit></submit>",
                      prompt_token_ids=list(range(20)) if prompt_ids else None,
                      token_ids=[4] if prompt_ids else None,
                      tool_results=[{"name": "submit", "ok": True}]))
    if passed is None:
        return Trajectory(task_key="k", task_hash=task_hash, domain=domain, split="eval", policy_version="p",
                          status="infra_error", turns=turns,
                          error=ErrorInfo(type="SandboxError", message="died", where="sandbox"),
                          timings={"total_s": 1.0})
    return Trajectory(task_key="k", task_hash=task_hash, domain=domain, split="eval", policy_version="p",
                      status="completed", turns=turns, verdict=Verdict(passed, float(passed)),
                      reward=float(passed), sandbox={"backend": "bwrap"},
                      timings={"gen_s": 0.5, "tool_s": 0.25, "verify_s": 0.125, "total_s": 1.0})
