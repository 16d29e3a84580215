"""What `posttrain tasks check` checks: the self-test every domain must pass before anything
trains on it. (The command, and the engine workload that plays the attempts, live in
`posttrain.scheduling.domain_check`: tasks know nothing of environments.)

For each domain and each sampled (seed, split):

* generation is deterministic: generating twice gives byte-identical tasks of that split, and
  (`posttrain.tasks.elsewhere`, run beside the check by `check_domains`) a child process with
  another hash seed, time zone, working directory and day generates the same task;
* the oracle passes;
* `negatives` has 'empty' and at least one wrong attempt, and every negative fails;
* grading is stable: the same outcome verified twice gives the same verdict (the flip rate);
* every verdict keeps the contract: `passed` a bool, `score` a finite number in [0, 1]
  (`verifiers.base.held_to_contract`, which scores a broken one 0 wherever it is trained on);
* no adversary passes (`posttrain.tasks.adversaries`: attempts that try to game the grader
  without solving the task), nor turns into an infrastructure error: `hack_pass_rate` is 0.

And over the domain's task *distribution*: the constant-answer probe (`posttrain.tasks.guess`),
run by `check_domains` on directly graded domains; its findings are warnings.

`check_with(domain, grade, regrade_all=...)` runs these checks; `grade` grades all the attempts
at one task at once (so a caller can play them as one batch of episodes). Domains whose verifier
needs nothing but the answer are graded directly (`grade_directly`: `verifier.verify(task,
Outcome(answer=actions[-1]))`), and every outcome is graded twice. Others are played as
episodes; to keep that affordable only the oracle is played twice, and the batches of up to
`TASKS_AT_ONCE` tasks are played at once (each task generated, and its results counted, in
sample order: the report is the task-by-task one). An exception while grading
is an *infrastructure* failure: it is counted as such, never as a pass or a fail; after
`MAX_BROKEN_TASKS_IN_A_ROW` tasks that failed on infrastructure alone, the domain's remaining
tasks are skipped.
"""

from __future__ import annotations

import contextlib
import re
import time
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from posttrain.tasks.adversaries import adversaries, check_adversaries
from posttrain.tasks.domain import Domain, NoTasksInSplit
from posttrain.tasks.guess import Guess
from posttrain.values.task import Split, Task
from posttrain.values.verdict import Verdict
from posttrain.verifiers.base import INVALID_SCORE, Outcome, verify

FAILURE_KINDS = ("generate_error", "nondeterministic", "oracle_failed", "negatives_incomplete",
                 "negative_passed", "flip", "infra_error", "hack_passed", "hack_code_ran",
                 "hack_infra_error", "invalid_score")


MAX_BROKEN_TASKS_IN_A_ROW = 2
"""a domain whose tasks fail this many times in a row on infrastructure alone (the sandbox does
not start, the verifier always crashes) is not checked further: it would only repeat the error"""


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
    """wall time of the domain's check (and of its constant-answer probe, when run)"""
    failures: list[Failure] = field(default_factory=list)
    guess: Guess | None = None
    """the constant-answer probe (`guess_probe`); None when not run (a sandboxed domain, or
    `guess_tasks` 0)"""


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
                                         "hacks": c.hacks, "seconds": round(c.seconds, 3),
                                         **({"guess": {**asdict(c.guess), "excess": round(c.guess.excess, 4)}}
                                            if c.guess else {})}
                              for c in self.checked},
                "guessable": {c.domain: {"answer": c.guess.answer, "rate": c.guess.rate,
                                         "chance": round(c.guess.chance, 4)}
                              for c in self.checks if c.guess and c.guess.guessable},
                "splits_differ": {c.domain: c.guess.split_p for c in self.checks
                                  if c.guess and c.guess.splits_differ},
                "failures": [asdict(f) for f in self.failures]}

    def by_family(self) -> dict[str, list[DomainCheck]]:
        out: dict[str, list[DomainCheck]] = {}
        for c in self.checks:
            out.setdefault(c.family, []).append(c)
        return out


Grade = Callable[[Domain, Task, Sequence[Sequence[str]]], list[Verdict | BaseException]]
"""Grades every attempt (its turns) at one task: per attempt, in order, its verdict or the
infrastructure failure that kept it from one"""


class EpisodeFailed(Exception):
    """An attempt that ended as an infrastructure failure where it was played (an episode the
    engine ran): the original exception's type name and where it was raised."""

    def __init__(self, kind: str, message: str, at: str) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind, self.message, self.at = kind, message, at

    _FRAME = re.compile(r'File "([^"]+)", line (\d+)')

    @classmethod
    def from_traceback(cls, kind: str, message: str, tb: str, where: str) -> EpisodeFailed:
        """`tb` a formatted traceback: `at` is its innermost frame ('file:line'), else `where`."""
        frames = cls._FRAME.findall(tb)
        return cls(kind, message, f"{frames[-1][0]}:{frames[-1][1]}" if frames else where)


def grade_directly(domain: Domain, task: Task, attempts: Sequence[Sequence[str]]) -> list[Verdict | BaseException]:
    """The verifier on each attempt's last turn as the answer (domains that need no episode)."""
    out: list[Verdict | BaseException] = []
    for actions in attempts:
        try:
            out.append(verify(domain.verifier, task, Outcome(answer=actions[-1] if actions else None)))
        except Exception as e:  # noqa: BLE001 - an infrastructure failure, counted by the caller
            out.append(e)
    return out


def _describe(e: BaseException) -> str:
    if isinstance(e, EpisodeFailed):
        return f"{e.kind}: {e.message} (at {e.at})"
    frames = traceback.extract_tb(e.__traceback__)
    at = f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    return f"{type(e).__name__}: {e}{at}"


def _same(a: Verdict, b: Verdict) -> bool:
    return a.passed == b.passed and a.score == b.score


def sampled(per_domain: int, seeds: Sequence[int] | None) -> list[tuple[int, Split]]:
    """The i-th task uses seed `seeds[i]` (default i), train for even i, eval for odd i."""
    chosen = list(range(per_domain)) if seeds is None else list(seeds)[:per_domain]
    return [(s, "train" if i % 2 == 0 else "eval") for i, s in enumerate(chosen)]


@dataclass
class _Prepared:
    """One task's attempts, ready to be graded as one batch."""

    task: Task
    attempts: list[tuple[str, list[str], bool]]
    """(name, actions, should_pass): the oracle, then each negative"""
    hacks: dict[tuple[str, ...], list[str]]
    batch: list[list[str]]


def _prepare(domain: Domain, seed: int, split: Split, out: DomainCheck, regrade_all: bool) -> _Prepared | int | None:
    """Generate one task and its attempts (in the caller's thread: generators need not be
    thread-safe). None: the domain has no tasks in `split`; 1: generation failed (recorded)."""

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
    if task.model_dump_json() != again.model_dump_json() or task.split != split:
        fail("nondeterministic", f"generate({seed}, {split!r}) differs between calls or has split "
                                 f"{task.split!r}")
    if "empty" not in negatives or len(negatives) < 2:
        fail("negatives_incomplete", f"negatives are {sorted(negatives)}; need 'empty' and a wrong one")

    # every attempt at this task (the graded-twice ones twice, the adversaries once) in one batch
    attempts = [("oracle", oracle, True)] + [(name, acts, False) for name, acts in negatives.items()]
    hacks = {tuple(acts): list(acts) for acts in adversaries(domain, task).values()}
    batch: list[list[str]] = []
    for _, actions, should_pass in attempts:
        batch += [actions, actions] if (regrade_all or should_pass) else [actions]
    batch += hacks.values()
    return _Prepared(task, attempts, hacks, batch)


def _judge(domain: Domain, seed: int, split: Split, prep: _Prepared, out: DomainCheck,
           graded_batch: Sequence[Verdict | BaseException], regrade_all: bool) -> int:
    """Count one task's graded batch into `out`; returns how many attempts were graded (0:
    only infrastructure errors)."""

    def fail(kind: str, detail: str) -> None:
        out.failures.append(Failure(domain.name, kind, seed, split, detail))

    graded = 0
    results = iter(graded_batch)
    for name, actions, should_pass in prep.attempts:
        first = next(results)
        second = next(results) if (regrade_all or should_pass) else None
        error = next((r for r in (first, second) if isinstance(r, BaseException)), None)
        if error is not None:
            out.infra_errors += 1
            fail("infra_error", f"{name}: {_describe(error)}")
            continue
        assert isinstance(first, Verdict)
        graded += 1
        broken = next((v.details[INVALID_SCORE] for v in (first, second)
                       if isinstance(v, Verdict) and INVALID_SCORE in v.details), None)
        if broken is not None:  # scored 0 where it is trained on; here it is the domain's fault
            fail("invalid_score", f"{name}: the verifier said {broken} (passed must be a bool, score "
                                  f"a finite number in [0, 1])")
        if isinstance(second, Verdict):
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
    hacked = dict(zip(prep.hacks, results))

    def graded_hack(actions: list[str]) -> Verdict:
        result = hacked[tuple(actions)]
        if isinstance(result, BaseException):
            raise result
        return result

    graded += check_adversaries(domain, prep.task, out, fail, graded_hack)
    return graded


TASKS_AT_ONCE = 2
"""tasks of one domain whose attempts are graded at once when `grade` plays them elsewhere (as
episodes in sandboxes: it mostly waits), so that one task's episodes start while another's last
ones finish and its grading sandboxes reset; `grade_directly` (this process's CPU, under one
interpreter lock) grades one task at a time"""


@dataclass
class _Unit:
    """One sampled (seed, split) on its way: generated, its batch being graded."""

    seed: int
    split: Split
    part: DomainCheck
    """what this task adds to the domain's check (merged in sample order)"""
    prep: _Prepared | int | None
    graded: Future[list[Verdict | BaseException]] | None = None


def _start(domain: Domain, seed: int, split: Split, grade: Grade, regrade_all: bool,
           pool: ThreadPoolExecutor | None) -> _Unit:
    part = DomainCheck(domain.name, domain.family, domain.env)
    prep = _prepare(domain, seed, split, part, regrade_all)
    if prep is None:  # a one-split domain (an imported task): check it in its split
        split = "eval" if split == "train" else "train"
        prep = _prepare(domain, seed, split, part, regrade_all)
    unit = _Unit(seed, split, part, prep)
    if isinstance(prep, _Prepared) and pool is not None:
        unit.graded = pool.submit(grade, domain, prep.task, prep.batch)
    return unit


def _finish(domain: Domain, unit: _Unit, grade: Grade, regrade_all: bool) -> int | None:
    if not isinstance(unit.prep, _Prepared):
        return unit.prep
    results = (unit.graded.result() if unit.graded is not None
               else grade(domain, unit.prep.task, unit.prep.batch))
    return _judge(domain, unit.seed, unit.split, unit.prep, unit.part, results, regrade_all)


def _merge(into: DomainCheck, part: DomainCheck) -> None:
    for f in fields(DomainCheck):
        if f.type == "int":
            setattr(into, f.name, getattr(into, f.name) + getattr(part, f.name))
    into.failures += part.failures


def check_with(domain: Domain, grade: Grade, *, regrade_all: bool, per_domain: int = 5,
               seeds: Sequence[int] | None = None, tasks_at_once: int | None = None) -> DomainCheck:
    """Check one domain on `per_domain` tasks (see the module docstring), its attempts graded by
    `grade`; `regrade_all`: grade every outcome twice (else only the oracle's).

    Up to `tasks_at_once` tasks' batches are graded at once (default: `TASKS_AT_ONCE`, or 1
    for `grade_directly`), on threads; tasks are generated, and their results counted, in
    sample order in this thread, so the report is the one a task-by-task run gives (a batch
    started past the point where the domain is given up on is graded, then left out)."""
    out = DomainCheck(domain.name, domain.family, domain.env)
    t0 = time.perf_counter()
    width = tasks_at_once if tasks_at_once is not None else (1 if grade is grade_directly else TASKS_AT_ONCE)
    if width < 1:
        raise ValueError(f"tasks_at_once must be >= 1, got {width}")
    samples = sampled(per_domain, seeds)
    with contextlib.ExitStack() as stack:
        pool = stack.enter_context(ThreadPoolExecutor(width, "check-task")) if width > 1 else None
        units: dict[int, _Unit] = {}
        broken_in_a_row = 0
        for i, (seed, split) in enumerate(samples):
            for j in range(len(units) + i, min(len(samples), i + width)):  # keep `width` in flight
                units[j] = _start(domain, *samples[j], grade, regrade_all, pool)
            unit = units.pop(i)
            graded = _finish(domain, unit, grade, regrade_all)
            _merge(out, unit.part)
            if graded is None:
                out.failures.append(Failure(domain.name, "no_tasks", seed, split,
                                            "the domain has no tasks in either split"))
                break
            broken_in_a_row = broken_in_a_row + 1 if graded == 0 else 0
            if broken_in_a_row == MAX_BROKEN_TASKS_IN_A_ROW and i + 1 < len(samples):
                out.failures.append(Failure(domain.name, "infra_error", *samples[i + 1], (
                    f"stopped: {broken_in_a_row} tasks in a row failed on infrastructure only")))
                break
    out.seconds = time.perf_counter() - t0
    return out
