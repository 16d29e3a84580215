"""Reusing another run's evaluation of the same weights instead of drawing it again.

Two runs that start from one model and differ only in how they train (an A/B of two trainer
settings, two seeds of the scheduler) evaluate the starting weights identically: the same tasks,
the same seeded samples (`posttrain.evaluation.runner`), the same verdicts. `[eval] base_from =
"runs/other"` lets the second run copy those samples from the first one's store before it
evaluates; the runner then resumes from them, so it generates only what the other run did not
hold (other tasks, samples cut short). The result is an evaluation of these weights on these
tasks and seeds like one drawn here: two fresh draws of tiny-agent's evaluation of the math and
text domains (2,304 samples, 8 workers) gave the same answer in every sample, though batched
generation need not repeat a draw bit for bit everywhere (a fresh draw that differs in a few
samples is no truer than the copy).

What must match for a stored evaluation to be reused (`why_not`), each recorded with it by
`run_eval`:

* the policy: its version name, weights hash and tokenizer hash;
* the sampling settings (`k`, temperature, top-p, max tokens, seed);
* the source of posttrain itself (`posttrain.evaluation.identity.source_fingerprint`): a change
  to an environment, a verifier, a task generator or the generation code could change what a
  sample draws or how it is scored, and nothing short of the whole package says which changes
  cannot. A run of edited code therefore evaluates afresh; a run that differs from the other only
  by its config reuses.

Samples are matched by task hash and sample index, so a run whose task set is larger (more tasks
per domain, more domains) reuses what overlaps and draws the rest. Only finished samples are
copied (a sample whose stored attempts are infrastructure errors with retries left is drawn again,
as a resume would). Copying is keyed by each trajectory's identity, so a copy cut short by a kill
and repeated stores nothing twice.

What this does not check: the sandbox's own software (the bubblewrap and Python of the machine)
and the hardware's floating-point path -- reuse between runs on one machine, or on machines set
up alike.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from posttrain.evaluation.config import EvalConfig
from posttrain.evaluation.identity import identity
from posttrain.evaluation.runner import sampling_change, stored_samples
from posttrain.values.generation import PolicyVersion

BATCH = 500
"""trajectories copied per transaction"""


def why_not(recorded: dict[str, Any] | None, policy: PolicyVersion, config: EvalConfig) -> str | None:
    """Why an evaluation recorded with settings `recorded` (its run row's config) cannot stand for
    `policy` evaluated under `config`; None when it can."""
    if recorded is None:
        return "it holds no such evaluation"
    mine = identity(policy)
    if not (recorded.get("weights_hash") and recorded.get("source")):
        return "it was recorded without the identity reuse needs (an older posttrain)"
    for key, what in (("policy", "policy differs"), ("weights_hash", "weights differ"),
                      ("tokenizer_hash", "tokenizer differs")):
        if recorded.get(key) != mine[key]:
            return f"its {what} ({str(recorded.get(key))[:24]} there, {mine[key][:24]} here)"
    if recorded["source"] != mine["source"]:
        return "it was evaluated by other posttrain source (an edited environment or verifier could score otherwise)"
    if (changed := sampling_change(recorded, config)) is not None:
        return f"it was sampled with other settings ({changed})"
    return None


@dataclass(frozen=True)
class Reuse:
    """What `copy_evaluation` did: `copied` samples, or why none (`reason`)."""

    copied: int = 0
    reason: str | None = None


def copy_evaluation(donor: Any, store: Any, run_id: str, policy: PolicyVersion, config: EvalConfig,
                    task_hashes: Collection[str]) -> Reuse:
    """Copy into `store` the finished samples of `donor`'s evaluation `run_id` whose tasks are in
    `task_hashes`, when that evaluation can stand for `policy` under `config` (`why_not`)."""
    recorded = {r["id"]: r["config"] for r in donor.runs()}.get(run_id)
    reason = why_not(recorded, policy, config)
    if reason is not None:
        return Reuse(reason=reason)
    wanted = set(task_hashes)
    samples = [trajs for trajs in stored_samples(donor, run_id, policy.name, config).values()
               if trajs[0].task_hash in wanted]
    tasks: dict[str, Any] = {}
    items = []
    for trajs in samples:
        for traj in trajs:
            task = tasks.get(traj.task_hash)
            if task is None:
                task = tasks[traj.task_hash] = donor.get_task(traj.task_hash)
            items.append((traj, task, _workspace(donor, traj.final_workspace_sha256)))
    for i in range(0, len(items), BATCH):
        store.put_trajectories(items[i:i + BATCH])
    return Reuse(copied=len(samples))


def _workspace(donor: Any, sha256: str | None) -> bytes | None:
    """A trajectory's final workspace archive, None where it had none (or its store kept none)."""
    if not sha256:
        return None
    try:
        return donor.get_blob(sha256)
    except KeyError:
        return None
