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

Resuming (`resume=True`, with a store): an evaluation cut short by a kill continues where it
stopped. A sample whose stored attempts already ended it (a result, an error a retry cannot help,
or its retries spent) is not generated again: its stored trajectories make its record, so the
figures equal an uninterrupted run's (samples are seeded by identity, so the ones run now draw
what they would have drawn then). A sample that has only retryable infrastructure errors stored
runs again from its first attempt (an outage is no result to keep). Stored samples of another
policy, or of other sampling settings, are refused: they would make a mixture of two evaluations.

Episodes run as a workload on the one episode engine (`posttrain.scheduling.engine`), which
batches generation across them, retries infrastructure failures and keeps live sandboxes within
the workers; each attempt's result (trajectory, task, final workspace) goes to the store intact.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from posttrain.envs.single import SandboxFactory
from posttrain.evaluation.config import EvalConfig
from posttrain.evaluation.identity import identity
from posttrain.evaluation.policy import SeededPolicy
from posttrain.evaluation.records import Sample, TaskRecord
from posttrain.evaluation.result import EvalResult
from posttrain.policies.base import Policy, ScriptedPlayer
from posttrain.scheduling.engine import WorkItem, old_objects_frozen, run_workload
from posttrain.tasks.domain import Domain
from posttrain.values.episode import EpisodeResult
from posttrain.values.generation import SamplingParams
from posttrain.values.task import Task
from posttrain.values.trajectory import Trajectory


def run_eval(policy: Policy, tasks: Sequence[tuple[Domain, Task]], config: EvalConfig = EvalConfig(), *,
             name: str = "", policy_spec: str = "", task_source: str = "", store=None,
             sandbox_factory: SandboxFactory | None = None, resume: bool = False,
             sources: Sequence[str] = (),
             on_progress: Callable[[int, int], None] | None = None) -> EvalResult:
    """Evaluate `policy` on `tasks`; trajectories go to `store` (a `posttrain.storage.Store`) when
    given, under run id `eval:<name>`; `resume`: reuse the samples already stored there (see the
    module docstring). `on_progress(finished, total)`: called as each sample finishes (samples
    resumed from the store count as finished; an infrastructure error does not, its retry will).
    Raises ValueError on an empty task set, or on stored samples that are not this evaluation's."""
    if not tasks:
        raise ValueError("run_eval: the task set is empty")
    with old_objects_frozen():  # the records too: they allocate as much as the episodes
        return _run_eval(policy, tasks, config, name=name, policy_spec=policy_spec, task_source=task_source,
                         store=store, sandbox_factory=sandbox_factory, resume=resume, sources=sources,
                         on_progress=on_progress)


def _run_eval(policy: Policy, tasks: Sequence[tuple[Domain, Task]], config: EvalConfig, *, name: str,
              policy_spec: str, task_source: str, store, sandbox_factory: SandboxFactory | None,
              resume: bool, sources: Sequence[str],
              on_progress: Callable[[int, int], None] | None) -> EvalResult:
    tasks = list({t.hash: (d, t) for d, t in tasks}.values())  # a task listed twice is one task
    started = time.perf_counter()
    name = name or f"{policy.version.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    run_id = f"eval:{name}"
    sampling = SamplingParams(temperature=config.temperature, top_p=config.top_p,
                              max_tokens=config.max_tokens, seed=config.seed)
    seeded = SeededPolicy(policy, config.seed)
    index = {(t.hash, j): (d, t) for d, t in tasks for j in range(config.n_samples)}
    gids = {key: f"eval:{key[0][:16]}:{key[1]}" for key in index}
    done = (stored_samples(store, run_id, policy.version.name, config, {t.hash for _, t in tasks})
            if store is not None and resume else {})
    if store is not None:
        store.start_run(run_id, {"kind": "eval", "name": name, **identity(policy.version),
                                 "policy_spec": policy_spec, "tasks": task_source, "sources": list(sources),
                                 **config.to_dict()})

    todo = [key for key in index if gids[key] not in done]
    finished = len(index) - len(todo)

    def on_result(result: EpisodeResult) -> None:
        nonlocal finished
        if store is not None:
            store.put_trajectory(result.trajectory, result.task, result.workspace_archive)
        if on_progress is not None and result.trajectory.status != "infra_error":
            finished += 1
            on_progress(finished, len(index))

    items = [WorkItem(*index[key], group_id=gids[key]) for key in todo]
    results = run_workload(items, seeded, sampling, workers=config.workers, run_id=run_id,
                           retries=config.retries, sandbox_factory=sandbox_factory,
                           player=policy if isinstance(policy, ScriptedPlayer) else None,
                           on_result=on_result if store is not None or on_progress is not None else None)
    attempts = {key: done[gids[key]] for key in index if gids[key] in done}
    attempts.update({key: [r.trajectory for r in rs] for key, rs in zip(todo, results)})
    records = _records(tasks, config.n_samples, attempts)
    return EvalResult(name=name, policy=policy.version.name, config=config, records=records,
                      policy_spec=policy_spec, task_source=task_source,
                      wall_s=time.perf_counter() - started)


def _sampling_fields(config: EvalConfig | Mapping[str, Any]) -> dict[str, Any]:
    """What decides which samples an evaluation draws (not how many workers drew them)."""
    d = config.to_dict() if isinstance(config, EvalConfig) else dict(config)
    fields = {k: d.get(k) for k in ("k", "temperature", "top_p", "max_tokens", "seed")}
    fields["k"] = tuple(fields["k"] or ())  # a list once recorded as JSON
    return fields


def sampling_change(recorded: Mapping[str, Any], config: EvalConfig) -> str | None:
    """What differs between the sampling settings an evaluation recorded and `config`'s
    ("temperature 1.0 -> 0.7"); None when nothing that decides the samples does."""
    old, new = _sampling_fields(recorded), _sampling_fields(config)
    if old == new:
        return None
    return ", ".join(f"{k} {old[k]!r} -> {new[k]!r}" for k in new if old[k] != new[k])


def not_resumable(store: Any, run_id: str, policy_name: str, config: EvalConfig,
                  task_hashes: Collection[str] | None = None) -> str | None:
    """Why the samples stored under `run_id` are not this evaluation's (None when they are, or
    when there are none): another policy drew them, or other sampling settings, or (with
    `task_hashes`, the evaluation's tasks) some are of tasks it does not have -- an evaluation's
    rows are read back whole (its answers' shares, its figures), so they are one task set's."""
    recorded = {r["id"]: r["config"] for r in store.runs()}.get(run_id)
    if recorded is not None and (changed := sampling_change(recorded, config)) is not None:
        return f"{run_id}: its stored samples were drawn with other settings ({changed})"
    others = store.run_policy_versions(run_id) - {policy_name}
    if others:
        return (f"{run_id}: its stored samples are of policy {', '.join(sorted(others))}, "
                f"not {policy_name}")
    if task_hashes is not None and (stray := store.run_task_hashes(run_id) - set(task_hashes)):
        return f"{run_id}: {len(stray)} of its stored tasks are not among this evaluation's"
    return None


def superseded(result: EvalResult, policy_name: str, config: EvalConfig, task_hashes: Collection[str]) -> str | None:
    """Why a finished evaluation (`result`, as written) is not the one asked for (None when it
    is): other weights, other sampling settings or another task set drew it -- a run trained
    further, or a benchmark that chose other domains for an evaluation of the same name."""
    if result.policy != policy_name:
        return f"evaluated {result.policy}, not {policy_name}"
    if (changed := sampling_change(result.config.to_dict(), config)) is not None:
        return f"was drawn with other settings ({changed})"
    if {r.hash for r in result.records} != set(task_hashes):
        return "evaluated another task set"
    return None


def stored_samples(store: Any, run_id: str, policy_name: str, config: EvalConfig,
                   task_hashes: Collection[str] | None = None) -> dict[str, list[Trajectory]]:
    """Group id -> the stored attempts (in order) of each sample of `run_id` that is finished:
    its last attempt is a result, an error a retry cannot help, or its last allowed retry.
    Raises ValueError when the stored samples are not this evaluation's (`not_resumable`; with
    `task_hashes`, also where some are of other tasks)."""
    reason = not_resumable(store, run_id, policy_name, config, task_hashes)
    if reason is not None:
        raise ValueError(f"cannot resume {reason}")
    by_group: dict[str, list[Trajectory]] = {}
    for traj in store.trajectories(run_id=run_id):
        by_group.setdefault(traj.group_id, []).append(traj)
    done = {}
    for gid, trajs in by_group.items():
        trajs.sort(key=lambda t: t.attempt)
        last = trajs[-1]
        if (last.status != "infra_error" or (last.error is not None and not last.error.retryable)
                or last.attempt >= config.retries):
            done[gid] = trajs
    return done


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
