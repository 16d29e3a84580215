"""Helpers shared by the evaluation tests (no tests here): seeded coin-flip policies, toy domains
put into the registry, and synthetic trajectories."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

from posttrain.values.generation import Completion, GenerationRequest, PolicyVersion
from posttrain.values.trajectory import ErrorInfo, Trajectory, Turn
from posttrain.values.verdict import Verdict


class CoinPolicy:
    """Answers a task's oracle with probability p (per domain), else its 'wrong' negative.

    The coin is drawn from the request's sampling seed alone, so results depend only on the seeds
    the evaluator assigns: that is what makes runs reproducible and A/B pairs identical. Like any
    scripted player it never sees the task: the engine hands it both scripts per group."""

    roles = ("oracle", "wrong")

    def __init__(self, p: float | Mapping[str, float], name: str = "coin") -> None:
        self.p = p
        self.version = PolicyVersion(name=name)
        self.seeds: list[int | None] = []
        self.scripts: dict[str, Mapping[str, Sequence[str]]] = {}

    def assign(self, route: str, scripts: Mapping[str, Sequence[str]]) -> None:
        self.scripts[route] = scripts

    def refuse(self, route: str, reason: str) -> None:
        raise AssertionError(f"no script for {route}: {reason}")

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        out = []
        for req in requests:
            self.seeds.append(req.sampling.seed)
            p = self.p if isinstance(self.p, float) else self.p.get(req.meta["domain"], 0.5)
            good = random.Random(req.sampling.seed).random() < p
            scripts = self.scripts[req.meta["group_id"]]
            out.append(Completion(text=scripts["oracle" if good else "wrong"][0], finish_reason="stop"))
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
