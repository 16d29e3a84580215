"""`posttrain tasks check` as a workload on the one episode engine.

    from posttrain.scheduling.domain_check import check_domains
    report = check_domains(registry.match_domains("terminal.*"), per_domain=2)
    report.ok, report.summary()["hack_pass_rate"]

What is checked, and how a report reads, is the tasks layer's (`posttrain.tasks.check`). This
module plays the attempts: a domain whose episodes need no sandbox (a single answer, graded on
its own) is graded directly by its verifier, every outcome twice; every other domain's attempts
at a task (the oracle twice, each negative, each adversary) run as one batch of episodes on the
engine (`posttrain.scheduling.engine.run_workload`), each played by a scripted policy that is
handed its turns by group id, never the task. The episodes of a run take their sandboxes from
one warm pool (booting the next sandbox while an episode runs). An episode that ends as an
infrastructure error is that attempt's infrastructure failure (never a pass or a fail). When the
sandbox cannot be imported, the domains that need one are reported "not checked" (a visible
count); when it cannot start, each of their episodes reports that as an infrastructure error.

`check_domains(..., workers=n)` spreads registered domains over `n` forked processes (domains hold
closures, so workers look them up by name in the registry); with one worker (the default) the
registered domains graded directly are checked in one forked process beside the sandboxed ones.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import NamedTuple

from posttrain.envs import EnvConfig, default_sandbox_factory, needs_sandbox, sandbox_preload
from posttrain.envs.single import SandboxFactory
from posttrain.policies.scripted import ScriptedPolicy
from posttrain.scheduling.engine import WorkItem, run_workload
from posttrain.tasks.check import (
    CheckReport,
    DomainCheck,
    EpisodeFailed,
    Failure,
    Grade,
    check_with,
    grade_directly,
    sampled,
)
from posttrain.tasks.domain import Domain
from posttrain.tasks.elsewhere import Elsewhere, ElsewhereFailed, differences
from posttrain.tasks.guess import guess_probe
from posttrain.values.episode import EpisodeResult
from posttrain.values.task import Task
from posttrain.values.verdict import Verdict

POOL_SIZE = 2
"""warm sandboxes (and engine workers) serving the episodes of one process's domains"""


CHECK_ENV = EnvConfig(snapshot_turns=False)
"""a self-check's episodes are graded, never inspected or branched from a turn: no workspace
snapshot after every tool turn (one overlay copy each); nothing a grader sees depends on them"""


def engine_grader(sandbox_factory: SandboxFactory, workers: int = POOL_SIZE) -> Grade:
    """A `Grade` that plays the attempts at a task as episodes on the engine, `workers` at once,
    in sandboxes from `sandbox_factory`."""

    def grade(domain: Domain, task: Task, attempts: Sequence[Sequence[str]]) -> list[Verdict | BaseException]:
        ids = [f"check:{i}" for i in range(len(attempts))]
        policy = ScriptedPolicy.by_group(dict(zip(ids, attempts)), name="scripted:check")
        runs = run_workload([WorkItem(domain, task, gid) for gid in ids], policy, env_config=CHECK_ENV,
                            sandbox_factory=sandbox_factory, workers=workers)
        return [_verdict(attempts_of_one[-1]) for attempts_of_one in runs]

    return grade


def _verdict(result: EpisodeResult) -> Verdict | BaseException:
    traj = result.trajectory
    if traj.status == "infra_error" or traj.verdict is None:
        error = traj.error
        if error is None:
            return EpisodeFailed("NoVerdict", f"episode ended {traj.status} without a verdict", "engine")
        return EpisodeFailed.from_traceback(error.type, error.message, error.traceback, error.where)
    return traj.verdict


class _SandboxMissing(Exception):
    """`posttrain.sandbox` does not import here: sandboxed domains cannot be checked."""


def check_domain(domain: Domain, per_domain: int = 5, seeds: Sequence[int] | None = None,
                 sandbox_factory: SandboxFactory | None = None, guess_tasks: int = 0) -> DomainCheck:
    """Check one domain on `per_domain` tasks (see `posttrain.tasks.check`). `sandbox_factory`
    serves the episodes of a sandboxed domain (default: a warm pool opened for this domain).
    `guess_tasks` > 0: then the constant-answer probe (`posttrain.tasks.guess.guess_probe`) on
    that many train tasks, if the domain is graded directly."""
    if not needs_sandbox(domain):
        out = check_with(domain, grade_directly, regrade_all=True, per_domain=per_domain, seeds=seeds)
        if guess_tasks:
            t0 = time.perf_counter()
            out.guess = guess_probe(domain, guess_tasks)
            out.seconds += time.perf_counter() - t0
        return out
    if sandbox_factory is None:
        try:
            with _sandboxes([domain]) as factory:
                return check_domain(domain, per_domain, seeds, factory)
        except _SandboxMissing as e:
            return DomainCheck(domain.name, domain.family, domain.env, not_checked=str(e))
    return check_with(domain, engine_grader(sandbox_factory), regrade_all=False, per_domain=per_domain,
                      seeds=seeds)


class _Plan(NamedTuple):
    """What to check on each domain: `check_domain`'s arguments but the sandboxes."""

    per_domain: int
    seeds: Sequence[int] | None
    guess_tasks: int


def _check_all(domains: Sequence[Domain], plan: _Plan) -> list[DomainCheck]:
    """The domains in order; each run of neighbouring domains that preload the same modules is
    served by one pool, preloaded for them alone (a pool preloaded for every domain would make
    each code or terminal episode's sandbox import geometry's numpy and manifold3d too: larger
    forks, and ~120 ms instead of ~25 ms for each job-server start)."""
    out: list[DomainCheck] = []
    for _, group in itertools.groupby(domains, key=lambda d: sandbox_preload([d])):
        out += _check_group(list(group), plan)
    return out


def _check_group(domains: Sequence[Domain], plan: _Plan) -> list[DomainCheck]:
    """The domains in order, the sandboxed ones served by one pool."""
    try:
        with _sandboxes(domains) as factory:
            return [check_domain(d, plan.per_domain, plan.seeds, factory, plan.guess_tasks) for d in domains]
    except _SandboxMissing as e:
        return [check_domain(d, plan.per_domain, plan.seeds, guess_tasks=plan.guess_tasks) if not needs_sandbox(d)
                else DomainCheck(d.name, d.family, d.env, not_checked=str(e)) for d in domains]


@contextmanager
def _sandboxes(domains: Sequence[Domain]) -> Iterator[SandboxFactory | None]:
    """A warm pool when any domain needs one (None when none does). A sandbox that cannot start
    here yields the default factory: each episode then reports why as an infrastructure error."""
    if not any(needs_sandbox(d) for d in domains):
        yield None
        return
    try:
        from posttrain.sandbox import SandboxPool, SandboxUnavailable
    except ImportError as e:
        raise _SandboxMissing(f"the sandbox is not importable: {e}") from e
    try:
        pool = SandboxPool(size=POOL_SIZE, preload=sandbox_preload(domains))
    except SandboxUnavailable:
        yield default_sandbox_factory(domains)
        return
    with pool:
        yield pool.sandbox


def _check_named(args: tuple[list[str], _Plan]) -> list[DomainCheck]:
    from posttrain.tasks.registry import get_domain

    names, plan = args
    return _check_all([get_domain(n) for n in names], plan)


def check_domains(domains: Iterable[Domain], per_domain: int = 5, seeds: Sequence[int] | None = None,
                  workers: int = 1, guess_tasks: int = 0, elsewhere: bool = True,
                  sources: Sequence[str] = ()) -> CheckReport:
    """Check every domain. `workers > 1` spreads registered domains over forked processes;
    domains the registry does not know are checked in this process. With one worker, registered
    domains graded directly (no sandbox: math, text, reasoning-gym, documents) are checked in one
    forked process beside this one's sandboxed domains: those keep this process waiting on
    sandboxes (about 1.5 of 2 cores busy on a quiet 2-core machine), which the direct ones (one
    core, the interpreter lock) fill. `guess_tasks` > 0: the constant-answer probe
    (`posttrain.tasks.guess.guess_probe`) on that many train tasks of each directly graded
    domain, right after its check and in the same process (so the probes of reasoning-gym's
    generators, minutes in all, run beside the sandboxed domains' checks, not after them).
    `elsewhere`: the same tasks are also generated by a child process with another hash seed,
    time zone, working directory and day (`posttrain.tasks.elsewhere`, beside the check; `sources`
    are registered there too), and a directly graded domain's oracle and negatives graded there; a
    task or verdict that differs there fails its domain as nondeterministic, and a child that does
    not finish fails every domain as an infrastructure error."""
    if per_domain < 1:
        raise ValueError(f"per_domain must be >= 1, got {per_domain}")
    if guess_tasks < 0:
        raise ValueError(f"guess_tasks must be >= 0, got {guess_tasks}")
    domains = list(domains)
    t0 = time.perf_counter()
    specs = [(d.name, seed, split) for d in domains for seed, split in sampled(per_domain, seeds)]
    graded = {d.name for d in domains if not needs_sandbox(d)}
    child = Elsewhere(specs, sources, graded) if elsewhere and domains else None
    try:
        report = _check_domains(domains, _Plan(per_domain, seeds, guess_tasks), workers)
        if child is not None:
            _compare_elsewhere(report, domains, child, specs, graded)
    finally:
        if child is not None:
            child.close()
    report.seconds = time.perf_counter() - t0
    return report


def _compare_elsewhere(report: CheckReport, domains: list[Domain], child: Elsewhere, specs: list,
                       graded: set[str]) -> None:
    by_name = {c.domain: c for c in report.checks}
    try:
        theirs = child.hashes()
    except ElsewhereFailed as e:
        for c in report.checks:
            c.failures.append(Failure(c.domain, "infra_error", None, None, str(e)))
        return
    for diff in differences(domains, theirs, specs, graded):
        by_name[diff.domain].failures.append(Failure(diff.domain, "nondeterministic", diff.seed, diff.split,
                                                     diff.detail))


def _check_domains(domains: list[Domain], plan: _Plan, workers: int) -> CheckReport:
    t0 = time.perf_counter()
    if len(domains) < 2:
        return CheckReport(_check_all(domains, plan), time.perf_counter() - t0)

    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from posttrain.tasks.registry import all_domains

    registered = all_domains()
    if workers <= 1:
        chunks = [[d.name for d in domains if registered.get(d.name) is d and not needs_sandbox(d)]]
        if not chunks[0] or len(chunks[0]) == len(domains):
            return CheckReport(_check_all(domains, plan), time.perf_counter() - t0)
        beside = set(chunks[0])
        local = [d for d in domains if d.name not in beside]
    else:
        remote = [d.name for d in domains if registered.get(d.name) is d]
        local = [d for d in domains if registered.get(d.name) is not d]
        # Small interleaved chunks: neighbouring domains cost alike, so this balances the workers.
        chunks = [remote[i::workers * 4] for i in range(workers * 4) if remote[i::workers * 4]]
    results: dict[str, DomainCheck] = {}
    with ProcessPoolExecutor(max(1, workers), mp_context=multiprocessing.get_context("fork")) as pool:
        parts = pool.map(_check_named, [(c, plan) for c in chunks])  # submits all
        results.update((c.domain, c) for c in _check_all(local, plan))
        for part in parts:
            results.update((c.domain, c) for c in part)
    return CheckReport([results[d.name] for d in domains], time.perf_counter() - t0)
