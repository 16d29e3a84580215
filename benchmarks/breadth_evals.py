"""The breadth run's before/after figures, for `breadth.py` (which documents them): per-domain
pass@1 deltas, their null, the paired A/B counts, the answer rises, and the two further
evaluations of the learnable domains -- `--focus-tasks` (all of them on more tasks, in a process
beside the run) and `--confirm-worst` (the lowest few on fresh tasks, after it)."""

from __future__ import annotations

import os
import time
from collections import defaultdict
from pathlib import Path

from posttrain.pipeline.main import Job
from posttrain.pipeline.report import pass_of


def null_deltas(before, domains: list[str]) -> dict[str, float]:
    """Per domain: pass@1 of the odd samples minus the even ones, task by task, over sqrt 2 -- a
    draw of the delta between two independent evaluations of one policy (half the samples on each
    side, hence the scaling to the whole evaluation's standard error)."""
    wanted = set(domains)
    per: dict[str, list[float]] = defaultdict(list)
    for r in before.records:
        if r.domain not in wanted:
            continue
        sides: list[list[bool]] = [[], []]
        for j, sample in r.by_index().items():
            if sample.scored:
                sides[j % 2].append(bool(sample.passed))
        if sides[0] and sides[1]:
            per[r.domain].append(sum(sides[1]) / len(sides[1]) - sum(sides[0]) / len(sides[0]))
    return {d: (sum(v) / len(v)) / 2 ** 0.5 for d, v in per.items()}


def pass1_deltas(before, after, domains: list[str]) -> dict[str, float]:
    """Per domain, pass@1 after - before (domains either evaluation did not score left out)."""
    return {d: p1 - p0 for d in domains
            if (p0 := pass_of(before, d, "pass@1")) is not None and (p1 := pass_of(after, d, "pass@1")) is not None}


def ab_counts(before, after, domains: list[str]) -> tuple[int, int]:
    """(significant regressions, significant improvements) among `domains` in the paired A/B."""
    from posttrain.evaluation.ab import compare

    ab = compare(before, after)
    moved = [ab.domains[d] for d in domains if d in ab.domains]
    return sum(v["regression"] for v in moved), sum(v["improvement"] for v in moved)


def focus_tasks(job: Job, names: list[str], n_tasks: int, start: int = 0) -> tuple[list, list, int]:
    """The trained domains of `names` and their eval tasks of seeds `start`..`start + n_tasks - 1`,
    less a task equal to one of an earlier seed and those the contamination check finds in the
    training sample; and how many the check left out. `focus_evals` starts at 0,
    `confirm_figures` after the tasks already evaluated."""
    from posttrain.evaluation.contamination import check_contamination
    from posttrain.pipeline.checks import eval_tasks, train_sample

    wanted = set(names)
    domains = [d for d in job.train_domains if d.name in wanted]
    earlier = {t.hash for _, t in eval_tasks(domains, start)}
    tasks = [(d, t) for d, t in eval_tasks(domains, n_tasks, start=start) if t.hash not in earlier]
    train = train_sample(domains, job.contamination_per_domain())
    leaked = set(check_contamination(train, [t for _, t in tasks]).leaked_eval_hashes)
    return domains, [(d, t) for d, t in tasks if t.hash not in leaked], len(leaked)


def focus_evals(job: Job, learnable: list[str], n_tasks: int) -> tuple:
    """The learnable domains evaluated again on `n_tasks` eval tasks each (the first `n_tasks` of the
    eval split, so the run's own among them; at the run's samples), by
    the starting and the trained weights: `evals/focus-before.json`, `evals/focus-after.json`.

    With 4 tasks a domain, a policy that settled on one answer (`rg.circuit_logic`: "0" in 26 of
    32 samples after training) moves by whatever those 4 tasks' answers happen to be; the odd/even
    null above does not see that noise (it resamples the same tasks). Like the run's own
    evaluations these are resumable (a kill loses no stored sample) and loaded when done (by the
    process `focus_beside` ran beside the run, usually). Tasks that the contamination check finds
    in the training sample are left out (and counted): the run checked only its own 4 a domain.
    Returns (before, after, leaked task count)."""
    domains, tasks, leaked = focus_tasks(job, learnable, n_tasks)
    return (*before_and_after(job, domains, tasks, "focus"), leaked)


def before_and_after(job: Job, domains: list, tasks: list, name: str) -> tuple:
    """`tasks` evaluated by the starting weights (`evals/<name>-before.json`) and the trained ones
    (`<name>-after.json`), each loaded if already written, continued if cut short."""
    from posttrain.pipeline.main import _policy
    from posttrain.scheduling.engine import sandbox_pool
    from posttrain.storage.store import Store

    cfg = job.config
    trainer, _ = job.make_trainer()
    with Store.for_run_dir(cfg.run_dir) as store, sandbox_pool(domains, cfg.scheduler.workers) as factory:
        before = job.evaluate(job._base_policy(), f"{name}-before", tasks, store, factory)
        after = job.evaluate(_policy(trainer), f"{name}-after", tasks, store, factory)
    return before, after


def confirm_figures(job: Job, stage: dict[str, float], k: int, n_tasks: int, skip: int) -> dict:
    """The `k` domains of `stage` (domain -> delta) whose deltas were lowest, evaluated again by
    the starting and the trained weights on `n_tasks` eval tasks each that no earlier evaluation
    had (eval seeds from `skip` on; tasks equal to an earlier one, or found in the training sample,
    are left out): `evals/confirm-<k>x<n>-{before,after}.json` (resumable, as the others).

    Why: the worst of 40 deltas is the least of 40 noisy readings, biased low by the choice itself,
    and at 4 or 20 tasks a domain too coarse to read against -0.02 (one sample of 32 is 0.031).
    These readings are fresh, so unbiased for the domains chosen, and paired: the runner seeds
    sample j of a task alike under both weights, so the two sides differ only where the weights
    sample differently; the delta's noise comes from the discordant pairs alone. Per domain: the
    delta with its task-bootstrap interval, the discordant pairs (`a_only`: passed before only),
    and whether the paired A/B (Holm over the `k`) finds a regression. And `settled_worst_delta`
    (and `_domain`): the lowest of every domain's delta read on its largest evaluation -- the
    confirmation's for the `k` chosen, `stage`'s for the rest -- so a domain just above the
    chosen ones that still reads below the target at `stage`'s size is not hidden by the
    confirmation of the lowest `k`."""
    from posttrain.evaluation.ab import compare

    if not k or not n_tasks or not stage:
        return {}
    chosen = sorted(stage, key=lambda d: (stage[d], d))[:k]
    domains, tasks, _ = focus_tasks(job, chosen, n_tasks, start=skip)
    t0 = time.perf_counter()
    before, after = before_and_after(job, domains, tasks, f"confirm-{k}x{n_tasks}")
    ab = compare(before, after).domains
    per = {d: {"stage_delta": round(stage[d], 4), "delta": ab[d]["diff"], "ci": ab[d]["ci"],
               "tasks": ab[d]["tasks"], "a_only": ab[d]["a_only"], "b_only": ab[d]["b_only"],
               "regression": ab[d]["regression"]} for d in chosen if d in ab}
    worst = min(per, key=lambda d: per[d]["delta"]) if per else None
    settled = {**stage, **{d: v["delta"] for d, v in per.items()}}
    settled_worst = min(settled, key=lambda d: (settled[d], d))
    return {"confirm_k": k, "confirm_tasks": n_tasks, "confirm_skip": skip,
            "confirm_worst_delta": per[worst]["delta"] if worst else None,
            "confirm_worst_domain": worst, "confirm_worst_ci": per[worst]["ci"] if worst else None,
            "confirm_regressions": sum(v["regression"] for v in per.values()),
            "confirm_domains": per, "confirm_s": round(time.perf_counter() - t0, 1),
            "settled_worst_delta": settled[settled_worst], "settled_worst_domain": settled_worst}


def _wait_for(ready, done: Path, poll_s: float = 5.0):
    """`ready()`'s first true value; None once `done` exists and `ready()` is still false."""
    while True:
        finished = done.exists()  # looked at first: a run that ended has written all it will
        value = ready()
        if value or finished:
            return value or None
        time.sleep(poll_s)


def focus_beside(job: Job, n_tasks: int, done: Path) -> None:
    """`--focus-tasks`' evaluations in a second process beside the run (`main` starts it): the
    starting weights' as soon as the run's base evaluation has named the learnable domains, the
    trained weights' as soon as the run's last checkpoint is written -- while the run trains and
    makes its final evaluation, on a machine that one evaluation does not keep busy (tiny-agent's
    episodes wait on their sandboxes). It stores exactly what `focus_evals` would (the same tasks,
    the same weights, resumable), so the run's process loads them afterwards instead of generating
    them. It gives up when `done` appears (the run ended short of its last step: the run's process
    then evaluates whatever it trained) and dies with its parent (a killed benchmark: `--resume`
    starts it again and it continues the stored evaluations)."""
    import torch

    from posttrain.evaluation.result import EvalResult
    from posttrain.pipeline.checks import unfit_domains
    from posttrain.pipeline.main import _policy
    from posttrain.scheduling.engine import sandbox_pool
    from posttrain.storage.store import Store
    from posttrain.training.trainer import Trainer

    cfg = job.config
    torch.set_num_threads(beside_threads(cfg.model.threads))  # before any thread of this process runs an op
    before_path = cfg.run_dir / "evals" / "before.json"
    if _wait_for(before_path.exists, done) is None:
        return
    base = job._base_policy()
    # the run's trained domains: those whose prompts fit (the run leaves the others out)
    unfit = unfit_domains(base, job.train_domains, job.eval_tasks()) if cfg.domains.skip_unfit else {}
    job.train_domains = [d for d in job.train_domains if d.name not in unfit]
    before = EvalResult.load(before_path)
    k = cfg.eval.n_samples
    learnable = [d.name for d in job.train_domains if (pass_of(before, d.name, f"pass@{k}") or 0) >= 0.2]
    if not learnable:
        return
    domains, tasks, _ = focus_tasks(job, learnable, n_tasks)
    with Store.for_run_dir(cfg.run_dir) as store, sandbox_pool(domains, cfg.scheduler.workers) as factory:
        job.evaluate(base, "focus-before", tasks, store, factory)
        del base
        latest = _wait_for(lambda: (c := job.checkpoints.latest()) is not None and c["step"] >= cfg.steps and c,
                           done)
        if latest is None:
            return
        job.evaluate(_policy(Trainer.resume(latest["path"])), "focus-after", tasks, store, factory)


def beside_threads(run_threads: int, cores: int | None = None) -> int:
    """torch threads for the process beside a run that uses `run_threads` (0: torch's default,
    every core): the cores the run leaves, no more than its own, at least 1. Two processes whose
    torch threads outnumber the cores spin against each other: on 2 cores two tiny-agent
    evaluations of 224 episodes took 544 s each side by side at 2 threads each, against 68 s alone;
    at 2 + 1 threads 147 s and 97 s (`benchmarks/colocation.py`)."""
    cores = cores or os.cpu_count() or 1
    used = run_threads or cores
    return max(1, min(used, cores - used))


def die_with_parent() -> None:
    """In the child before exec: SIGKILL when the parent dies (Linux prctl PR_SET_PDEATHSIG), so a
    killed benchmark leaves no evaluation running that its `--resume` would start a second time."""
    import ctypes
    import signal

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)


def focus_figures(job: Job, learnable: list[str], n_tasks: int) -> dict:
    """`focus_evals`' deltas (nothing without `n_tasks`): the same figures as the run's own, on
    more tasks a domain, with their null and paired A/B (and, for `confirm_figures`, the
    per-domain deltas under `"deltas"`)."""
    if not n_tasks or not learnable:
        return {}
    t0 = time.perf_counter()
    before, after, leaked = focus_evals(job, learnable, n_tasks)
    focus_s = time.perf_counter() - t0
    deltas = pass1_deltas(before, after, learnable)
    null = null_deltas(before, learnable)
    regressions, improvements = ab_counts(before, after, learnable)
    rises = answer_rises(job.config.run_dir, "focus-before", "focus-after", learnable)
    return {"focus_tasks": n_tasks, "focus_leaked_tasks": leaked,
            "focus_mean_delta": sum(deltas.values()) / len(deltas) if deltas else None,
            "focus_worst_delta": min(deltas.values()) if deltas else None,
            "focus_worst_domain": min(deltas, key=deltas.__getitem__) if deltas else None,
            "focus_null_worst_delta": min(null.values()) if null else None,
            "focus_significant_regressions": regressions,
            "focus_significant_improvements": improvements,
            **{f"focus_{k}": v for k, v in rises.items()},
            "focus_s": round(focus_s, 1), "deltas": deltas}


def answer_rises(run_dir: Path, before: str, after: str, domains: list[str], top: int = 5) -> dict:
    """How far the trained policy settled on one answer per domain of `domains`, between the
    evaluations `before` and `after` (`posttrain.evaluation.shortcuts`): the largest rise of a
    domain's commonest answer's share, its domain, and the `top` largest (answer, rise, the pass@1
    that answer earns). A constant answer learned where it pays and carried to look-alike prompts
    shows here before it costs a domain its pass rate."""
    from posttrain.evaluation.shortcuts import answer_shift, final_answers
    from posttrain.storage.store import Store

    with Store.for_run_dir(run_dir, readonly=True) as store:
        shift = answer_shift(final_answers(store, f"eval:{before}"), final_answers(store, f"eval:{after}"))
    wanted = set(domains)
    # largest first, ties as `shortcuts.largest_rise` breaks them: the first is its pick
    ranked = sorted((d for d in shift if d in wanted), key=lambda d: (shift[d]["rise"], d), reverse=True)[:top]
    return {"max_answer_rise": shift[ranked[0]]["rise"] if ranked else None,
            "max_answer_rise_domain": ranked[0] if ranked else None,
            "answer_rises": {d: {k: shift[d][k] for k in ("answer", "rise", "pass1_by_answer")} for d in ranked}}
