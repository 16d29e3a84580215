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

`_execute` is the one place that drives episodes; it calls the synchronous batched runner today
and is where the scheduler (`posttrain.scheduling`) will plug in.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack

from posttrain.envs import EnvConfig
from posttrain.envs.single import SandboxFactory
from posttrain.evaluation.config import EvalConfig
from posttrain.evaluation.policy import SeededPolicy
from posttrain.evaluation.records import Sample, TaskRecord
from posttrain.evaluation.result import EvalResult
from posttrain.policies.base import Policy
from posttrain.rollout.episode import Episode
from posttrain.rollout.runner import EpisodeSpec, run_episodes
from posttrain.tasks.domain import Domain
from posttrain.values.generation import SamplingParams
from posttrain.values.task import Task
from posttrain.values.trajectory import Trajectory


def _execute(specs: Sequence[EpisodeSpec], policy: Policy, sampling: SamplingParams, *, workers: int,
             run_id: str, sandbox_factory: SandboxFactory | None,
             on_done: Callable[[Episode], None] | None) -> list[Trajectory]:
    """Run episodes to the end, in the order given (the scheduler's future seam)."""
    return run_episodes(specs, policy, sampling, env_config=EnvConfig(), sandbox_factory=sandbox_factory,
                        workers=workers, run_id=run_id, on_done=on_done)


def _needs_sandbox(tasks: Sequence[tuple[Domain, Task]]) -> bool:
    return any(d.env == "tools" or d.verifier.needs_sandbox for d, _ in tasks)


def run_eval(policy: Policy, tasks: Sequence[tuple[Domain, Task]], config: EvalConfig = EvalConfig(), *,
             name: str = "", policy_spec: str = "", task_source: str = "", store=None,
             sandbox_factory: SandboxFactory | None = None) -> EvalResult:
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
                                 "policy_spec": policy_spec, "tasks": task_source, **config.to_dict()})

    def save(ep: Episode) -> None:
        store.put_trajectory(ep.result(), ep.task, ep.workspace_archive)

    with ExitStack() as stack:
        if sandbox_factory is None and _needs_sandbox(tasks):
            from posttrain.envs import sandbox_preload
            from posttrain.sandbox import SandboxPool

            preload = sandbox_preload(list({d.name: d for d, _ in tasks}.values()))
            sandbox_factory = stack.enter_context(SandboxPool(size=config.workers, preload=preload)).sandbox
        attempts: dict[tuple[str, int], list[Trajectory]] = {key: [] for key in index}
        pending = [EpisodeSpec(d, t, group_id=f"eval:{h[:16]}:{j}") for (h, j), (d, t) in index.items()]
        for attempt in range(config.retries + 1):
            if not pending:
                break
            trajs = _execute(pending, seeded, sampling, workers=config.workers, run_id=run_id,
                             sandbox_factory=sandbox_factory, on_done=save if store is not None else None)
            retry = []
            for spec, traj in zip(pending, trajs):
                attempts[(spec.task.hash, int(spec.group_id.rsplit(":", 1)[1]))].append(traj)
                if traj.status == "infra_error" and (traj.error is None or traj.error.retryable):
                    retry.append(EpisodeSpec(spec.domain, spec.task, spec.group_id, attempt + 1))
            pending = retry
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
