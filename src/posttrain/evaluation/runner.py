"""Running an evaluation: the eval split through the same episode machinery as training.

    from posttrain.evaluation import EvalConfig, resolve_policy, resolve_tasks, run_eval
    result = run_eval(resolve_policy("oracle"), resolve_tasks("math.add.*"), EvalConfig(k=(1, 8)))
    result.summary["macro_pass1"]

Each task is sampled n = max(k) times; sample j gets group id `eval:<task hash>:<j>` and a seed
derived from it (`posttrain.evaluation.policy.SeededPolicy`), so a rerun, or another policy in an
A/B comparison, sees identical tasks, prompts, tools and seeds. Episodes that end in
`infra_error` are retried (`EvalConfig.retries`) with the same seed, except a prompt that does
not fit the model's context (`ErrorInfo.where == 'context'`: a retry cannot help); the errors
still count in the infra-error rate, and a sample that never succeeds in running is excluded
from the scores.

Episodes run as a workload on the one episode engine (`posttrain.scheduling.engine`), which
batches generation across them, retries infrastructure failures and keeps live sandboxes within
the workers; each attempt's result (trajectory, task, final workspace) goes to the store intact.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from posttrain.envs.single import SandboxFactory
from posttrain.evaluation.config import EvalConfig
from posttrain.evaluation.policy import SeededPolicy
from posttrain.evaluation.records import Sample, TaskRecord
from posttrain.evaluation.result import EvalResult
from posttrain.policies.base import Policy, ScriptedPlayer
from posttrain.scheduling.engine import WorkItem, run_workload
from posttrain.tasks.domain import Domain
from posttrain.values.episode import EpisodeResult
from posttrain.values.generation import SamplingParams
from posttrain.values.task import Task
from posttrain.values.trajectory import Trajectory


def run_eval(policy: Policy, tasks: Sequence[tuple[Domain, Task]], config: EvalConfig = EvalConfig(), *,
             name: str = "", policy_spec: str = "", task_source: str = "", store=None,
             sandbox_factory: SandboxFactory | None = None, sources: Sequence[str] = ()) -> EvalResult:
    """Evaluate `policy` on `tasks`; trajectories go to `store` (a `posttrain.storage.Store`) when
    given, under run id `eval:<name>`. Raises ValueError on an empty task set."""
    if not tasks:
        raise ValueError("run_eval: the task set is empty")
    tasks = list({t.hash: (d, t) for d, t in tasks}.values())  # a task listed twice is one task
    started = time.perf_counter()
    name = name or f"{policy.version.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    run_id = f"eval:{name}"
    sampling = SamplingParams(temperature=config.temperature, top_p=config.top_p,
                              max_tokens=config.max_tokens, seed=config.seed)
    seeded = SeededPolicy(policy, config.seed)
    index = {(t.hash, j): (d, t) for d, t in tasks for j in range(config.n_samples)}
    if store is not None:
        store.start_run(run_id, {"kind": "eval", "name": name, "policy": policy.version.name,
                                 "policy_spec": policy_spec, "tasks": task_source, "sources": list(sources),
                                 **config.to_dict()})

    def save(result: EpisodeResult) -> None:
        store.put_trajectory(result.trajectory, result.task, result.workspace_archive)

    items = [WorkItem(d, t, group_id=f"eval:{h[:16]}:{j}") for (h, j), (d, t) in index.items()]
    results = run_workload(items, seeded, sampling, workers=config.workers, run_id=run_id,
                           retries=config.retries, sandbox_factory=sandbox_factory,
                           player=policy if isinstance(policy, ScriptedPlayer) else None,
                           on_result=save if store is not None else None)
    attempts = {key: [r.trajectory for r in rs] for key, rs in zip(index, results)}
    records = _records(tasks, config.n_samples, attempts)
    return EvalResult(name=name, policy=policy.version.name, config=config, records=records,
                      policy_spec=policy_spec, task_source=task_source,
                      wall_s=time.perf_counter() - started)


def _records(tasks: Sequence[tuple[Domain, Task]], n: int,
             attempts: dict[tuple[str, int], list[Trajectory]]) -> list[TaskRecord]:
    """Every attempt becomes a Sample (so failed attempts count in the infra-error rate); only
    the last attempt of a sample index can be scored."""
    records = []
    for d, t in tasks:
        rec = TaskRecord(hash=t.hash, key=t.key, domain=d.name, family=d.family, env=d.env,
                         split=t.split, seed=t.seed)
        rec.samples = [Sample.from_trajectory(traj, j) for j in range(n) for traj in attempts[(t.hash, j)]]
        records.append(rec)
    return records
