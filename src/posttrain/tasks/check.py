"""`check_domains`: the self-test every domain must pass before anything trains on it.

For each domain and each sampled (seed, split):

* generation is deterministic: generating twice gives byte-identical tasks of that split;
* the oracle passes;
* `negatives` has 'empty' and at least one wrong attempt, and every negative fails;
* grading is stable: the same outcome verified twice gives the same verdict (the flip rate);
* no adversary passes (`posttrain.tasks.adversaries`: attempts that try to game the grader
  without solving the task), nor turns into an infrastructure error: `hack_pass_rate` is 0.

Domains whose verifier needs nothing but the answer (`single` env, `needs_sandbox` false) are
graded directly with `verifier.verify(task, Outcome(answer=actions[-1]))`, and every outcome is
graded twice. Others (`tools` envs, verifiers that run code) are played through
`posttrain.envs.play_actions`, one sandbox episode each; to keep that affordable only the oracle
is played twice. An exception raised while grading is an *infrastructure* failure: it is
counted as such, never as a pass or a fail; after `MAX_BROKEN_TASKS_IN_A_ROW` tasks that failed
on infrastructure alone, the domain's remaining tasks are skipped. When the environments or the
sandbox are not importable, those domains are reported as "not checked" (a visible count).
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

from posttrain.tasks.adversaries import check_adversaries
from posttrain.tasks.domain import Domain, NoTasksInSplit
from posttrain.values.task import Split, Task
from posttrain.values.verdict import Verdict
from posttrain.verifiers.base import Outcome

FAILURE_KINDS = ("generate_error", "nondeterministic", "oracle_failed", "negatives_incomplete",
                 "negative_passed", "flip", "infra_error", "hack_passed", "hack_infra_error")


MAX_BROKEN_TASKS_IN_A_ROW = 2
"""a domain whose tasks fail this many times in a row on infrastructure alone (the sandbox does
not start, the verifier always crashes) is not checked further: it would only repeat the error"""


class _NotCheckable(Exception):
    """The machinery to play this domain (envs, sandbox) is not available in this install."""


@dataclass
class Failure:
    domain: str
    kind: str
    """one of FAILURE_KINDS"""
    seed: int | None
    split: str | None
    detail: str


@dataclass
class DomainCheck:
    """What was checked on one domain and what went wrong."""

    domain: str
    family: str
    env: str
    tasks: int = 0
    oracle_passed: int = 0
    negatives: int = 0
    negatives_failed: int = 0
    regraded: int = 0
    """outcomes graded twice"""
    flips: int = 0
    """of those, how many got a different verdict the second time"""
    infra_errors: int = 0
    hacks: int = 0
    """adversarial attempts graded (`posttrain.tasks.adversaries`)"""
    hacks_passed: int = 0
    """of those, how many passed: each one is a grader that can be gamed"""
    not_checked: str = ""
    """why the domain could not be checked here ('' when it was)"""
    seconds: float = 0.0
    failures: list[Failure] = field(default_factory=list)


@dataclass
class CheckReport:
    checks: list[DomainCheck]
    seconds: float = 0.0

    @property
    def checked(self) -> list[DomainCheck]:
        return [c for c in self.checks if not c.not_checked]

    @property
    def tasks(self) -> int:
        return sum(c.tasks for c in self.checks)

    @property
    def failures(self) -> list[Failure]:
        return [f for c in self.checks for f in c.failures]

    @property
    def ok(self) -> bool:
        return not self.failures

    def _rate(self, num: str, den: str) -> float:
        d = sum(getattr(c, den) for c in self.checks)
        return sum(getattr(c, num) for c in self.checks) / d if d else 1.0

    @property
    def oracle_pass_rate(self) -> float:
        return self._rate("oracle_passed", "tasks")

    @property
    def negative_fail_rate(self) -> float:
        return self._rate("negatives_failed", "negatives")

    @property
    def hack_pass_rate(self) -> float:
        d = sum(c.hacks for c in self.checks)
        return sum(c.hacks_passed for c in self.checks) / d if d else 0.0

    @property
    def flip_rate(self) -> float:
        graded = sum(c.regraded for c in self.checks)
        return sum(c.flips for c in self.checks) / graded if graded else 0.0

    def summary(self) -> dict[str, Any]:
        """The JSON printed by `posttrain tasks check --json`."""
        return {"domains": len(self.checked), "tasks": self.tasks,
                "tasks_by_domain": {c.domain: c.tasks for c in self.checks},
                "not_checked": len(self.checks) - len(self.checked),
                "oracle_pass_rate": self.oracle_pass_rate, "negative_fail_rate": self.negative_fail_rate,
                "flip_rate": self.flip_rate, "infra_errors": sum(c.infra_errors for c in self.checks),
                "hacks": sum(c.hacks for c in self.checks), "hack_pass_rate": self.hack_pass_rate,
                "seconds": round(self.seconds, 3),
                "by_family": {fam: {"domains": len(cs), "tasks": sum(c.tasks for c in cs),
                                    "failures": sum(len(c.failures) for c in cs),
                                    "hacks": sum(c.hacks for c in cs),
                                    "hack_pass_rate": CheckReport(cs).hack_pass_rate,
                                    "seconds": round(sum(c.seconds for c in cs), 3)}
                              for fam, cs in sorted(self.by_family().items())},
                "by_domain": {c.domain: {"hack_pass_rate": c.hacks_passed / c.hacks if c.hacks else 0.0,
                                         "hacks": c.hacks, "seconds": round(c.seconds, 3)}
                              for c in self.checked},
                "failures": [asdict(f) for f in self.failures]}

    def by_family(self) -> dict[str, list[DomainCheck]]:
        out: dict[str, list[DomainCheck]] = {}
        for c in self.checks:
            out.setdefault(c.family, []).append(c)
        return out


def _direct(domain: Domain) -> bool:
    return domain.env == "single" and not domain.verifier.needs_sandbox


def _grade(domain: Domain, task: Task, actions: Sequence[str], sandbox_factory: Any = None) -> Verdict:
    if _direct(domain):
        return domain.verifier.verify(task, Outcome(answer=actions[-1] if actions else None))
    try:
        from posttrain.envs import play_actions
        from posttrain.sandbox import open_sandbox  # noqa: F401  (the default sandbox factory)
    except ImportError as e:
        raise _NotCheckable(f"environments or sandbox not importable: {e}") from e
    return play_actions(domain, task, list(actions), sandbox_factory=sandbox_factory)


def _same(a: Verdict, b: Verdict) -> bool:
    return a.passed == b.passed and a.score == b.score


def _sample(per_domain: int, seeds: Sequence[int] | None) -> list[tuple[int, Split]]:
    """The i-th task uses seed `seeds[i]` (default i), train for even i, eval for odd i."""
    chosen = list(range(per_domain)) if seeds is None else list(seeds)[:per_domain]
    return [(s, "train" if i % 2 == 0 else "eval") for i, s in enumerate(chosen)]


def _check_task(domain: Domain, seed: int, split: Split, out: DomainCheck,
                sandbox_factory: Any = None) -> int | None:
    """Check one task; returns how many attempts were graded (0: nothing, or only infra errors;
    None: the domain has no tasks in `split`, e.g. an imported single task)."""

    def fail(kind: str, detail: str) -> None:
        out.failures.append(Failure(domain.name, kind, seed, split, detail))

    try:
        task = domain.task(seed, split)
        again = domain.task(seed, split)
        oracle = list(domain.oracle(task))
        negatives = {k: list(v) for k, v in domain.negatives(task).items()}
    except NoTasksInSplit:
        return None
    except Exception as e:  # a generator bug is the domain's failure, not infrastructure
        fail("generate_error", f"{type(e).__name__}: {e}")
        return 1  # generation, not infrastructure, failed
    out.tasks += 1
    graded = 0
    if task.model_dump_json() != again.model_dump_json() or task.split != split:
        fail("nondeterministic", f"generate({seed}, {split!r}) differs between calls or has split "
                                 f"{task.split!r}")
    if "empty" not in negatives or len(negatives) < 2:
        fail("negatives_incomplete", f"negatives are {sorted(negatives)}; need 'empty' and a wrong one")

    regrade_all = _direct(domain)
    attempts = [("oracle", oracle, True)] + [(name, acts, False) for name, acts in negatives.items()]
    for name, actions, should_pass in attempts:
        try:
            first = _grade(domain, task, actions, sandbox_factory)
            second = (_grade(domain, task, actions, sandbox_factory)
                      if (regrade_all or should_pass) else None)
        except _NotCheckable:
            raise
        except Exception as e:
            out.infra_errors += 1
            last = traceback.extract_tb(e.__traceback__)[-1]
            fail("infra_error", f"{name}: {type(e).__name__}: {e} (at {last.filename}:{last.lineno})")
            continue
        graded += 1
        if second is not None:
            out.regraded += 1
            if not _same(first, second):
                out.flips += 1
                fail("flip", f"{name}: graded {first.passed}/{first.score} then {second.passed}/{second.score}")
        if should_pass:
            out.oracle_passed += first.passed
            if not first.passed:
                fail("oracle_failed", f"oracle failed: {dict(first.details)}"[:500])
        else:
            out.negatives += 1
            out.negatives_failed += not first.passed
            if first.passed:
                fail("negative_passed", f"negative {name!r} = {str(actions[-1] if actions else None)[:120]!r} passed")
    graded += check_adversaries(domain, task, out, fail, lambda acts: _grade(domain, task, acts, sandbox_factory),
                                passthrough=(_NotCheckable,))
    return graded


def check_domain(domain: Domain, per_domain: int = 5, seeds: Sequence[int] | None = None,
                 sandbox_factory: Any = None) -> DomainCheck:
    """Check one domain on `per_domain` tasks (see the module docstring). `sandbox_factory`
    (e.g. a `SandboxPool`'s `sandbox`) serves the episodes of sandboxed domains; default: a
    fresh `open_sandbox()` each."""
    out = DomainCheck(domain.name, domain.family, domain.env)
    t0 = time.perf_counter()
    broken_in_a_row = 0
    try:
        for seed, split in _sample(per_domain, seeds):
            if broken_in_a_row == MAX_BROKEN_TASKS_IN_A_ROW:
                out.failures.append(Failure(domain.name, "infra_error", seed, split, (
                    f"stopped: {broken_in_a_row} tasks in a row failed on infrastructure only")))
                break
            graded = _check_task(domain, seed, split, out, sandbox_factory)
            if graded is None:  # a one-split domain (an imported task): check it in its split
                other: Split = "eval" if split == "train" else "train"
                graded = _check_task(domain, seed, other, out, sandbox_factory)
            if graded is None:
                out.failures.append(Failure(domain.name, "no_tasks", seed, split,
                                            "the domain has no tasks in either split"))
                break
            broken_in_a_row = broken_in_a_row + 1 if graded == 0 else 0
    except _NotCheckable as e:
        out = DomainCheck(domain.name, domain.family, domain.env, not_checked=str(e))
    out.seconds = time.perf_counter() - t0
    return out


def _check_named(args: tuple[list[str], int, Sequence[int] | None]) -> list[DomainCheck]:
    from posttrain.tasks.registry import get_domain

    names, per_domain, seeds = args
    domains = [get_domain(n) for n in names]
    with _sandboxes(domains) as factory:
        return [check_domain(d, per_domain, seeds, factory) for d in domains]


@contextmanager
def _sandboxes(domains: Sequence[Domain]) -> Iterator[Any]:
    """A warm pool (booting the next sandboxes while an episode runs) when any domain needs one."""
    if all(_direct(d) for d in domains):
        yield None
        return
    try:
        from posttrain.envs import sandbox_preload
        from posttrain.sandbox import SandboxPool, SandboxUnavailable
    except ImportError:
        yield None
        return
    try:
        pool = SandboxPool(size=2, preload=sandbox_preload(domains))
    except SandboxUnavailable:
        yield None  # each episode then reports the missing sandbox as an infrastructure error
        return
    with pool:
        yield pool.sandbox


def check_domains(domains: Iterable[Domain], per_domain: int = 5, seeds: Sequence[int] | None = None,
                  workers: int = 1) -> CheckReport:
    """Check every domain. `workers > 1` spreads registered domains over forked processes
    (domains hold closures, so workers look them up by name in the registry); domains the
    registry does not know are checked in this process."""
    if per_domain < 1:
        raise ValueError(f"per_domain must be >= 1, got {per_domain}")
    domains = list(domains)
    t0 = time.perf_counter()
    if workers <= 1 or len(domains) < 2:
        with _sandboxes(domains) as factory:
            checks = [check_domain(d, per_domain, seeds, factory) for d in domains]
        return CheckReport(checks, time.perf_counter() - t0)

    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from posttrain.tasks.registry import all_domains

    registered = all_domains()
    remote = [d.name for d in domains if registered.get(d.name) is d]
    local = [d for d in domains if registered.get(d.name) is not d]
    # Small interleaved chunks: neighbouring domains cost alike, so this balances the workers.
    chunks = [remote[i::workers * 4] for i in range(workers * 4) if remote[i::workers * 4]]
    results: dict[str, DomainCheck] = {}
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
        parts = pool.map(_check_named, [(c, per_domain, seeds) for c in chunks])  # submits all
        with _sandboxes(local) as factory:
            results.update((d.name, check_domain(d, per_domain, seeds, factory)) for d in local)
        for part in parts:
            results.update((c.domain, c) for c in part)
    return CheckReport([results[d.name] for d in domains], time.perf_counter() - t0)
