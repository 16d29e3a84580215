"""What a run trains, as the scheduler sees it: one `DomainSpec` per trained domain, and domains
whose quarantined tasks are never drawn.

* `domain_specs`: `[domains] weights` and the `[scheduler.domains."GLOB"]` overrides applied to
  each trained domain (later globs win); a glob that matches no trained domain is an error (a
  typo would otherwise change nothing, silently).
* `concurrency_warnings`: the domains whose `max_concurrency` cannot hold their share of a step
  (then the step is filled from the domains that can go, and the weights do not hold per step).
* `signal_prior`: each trained domain's expected share of groups with a reward spread, from the
  base evaluation (`[scheduler.adaptive] prior_groups`).
* `without_quarantined`: a domain whose generator skips the tasks listed in quarantine files
  (`posttrain tasks noise` writes `RUN/quarantine.json`: tasks whose verdicts flip when verified
  again). A quarantined seed is redrawn deterministically, so the same run draws the same tasks.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from posttrain.envs import needs_sandbox
from posttrain.evaluation.noise import QUARANTINE_FILE, load_quarantine
from posttrain.pipeline.config import ConfigError, RunConfig
from posttrain.scheduling.config import DomainSpec
from posttrain.scheduling.work import derive_seed
from posttrain.tasks.domain import Domain, Split
from posttrain.values.task import Task

REDRAWS = 64
"""seeds tried after a quarantined one before the domain is declared exhausted"""


def domain_specs(cfg: RunConfig, domains: Sequence[Domain], left_out: Iterable[str] = ()) -> list[DomainSpec]:
    """`left_out`: domains the run selected but left out (`skip_unfit`); a glob that matches
    only those is not a typo."""
    overrides = cfg.scheduler.domains
    names = [d.name for d in domains] + list(left_out)
    unmatched = [g for g in overrides if not any(fnmatch.fnmatchcase(n, g) for n in names)]
    if unmatched:
        raise ConfigError(f"scheduler.domains: {', '.join(repr(g) for g in unmatched)} match(es) no "
                          f"trained domain ({len(domains)} trained)")
    specs = []
    for d in domains:
        sandboxed = needs_sandbox(d)
        fields: dict[str, object] = {"weight": cfg.domains.weights.get(d.name, 1.0), "sandboxed": sandboxed,
                                     "light": not sandboxed}
        for glob, override in overrides.items():
            if fnmatch.fnmatchcase(d.name, glob):
                fields.update(override.given())
        specs.append(DomainSpec(d.name, **fields))  # type: ignore[arg-type]
    return specs


def concurrency_warnings(cfg: RunConfig, specs: Sequence[DomainSpec]) -> list[str]:
    """The trainer tier's domains whose concurrency limit is below their share of one step.

    The scheduler admits a group only while its domain has fewer than `max_concurrency` episodes
    admitted and not finished, so such a domain holds at most ceil(limit / group_size) groups at
    a time. Where its weight asks for more of a step's `groups_per_step` than that, the
    scheduler -- which never leaves the generator idle while some domain can go -- fills the step
    from the other domains, the rare ones included: with 13 domains limited to 4 episodes and 16
    groups of 8 a step, every domain had about one group a step whatever its weight. One line
    naming how many domains, the worst, and the fix; [] when every limit can hold its share."""
    tier = cfg.scheduler.trainer_tier
    mine = [s for s in specs if s.tier == tier]
    total = sum(s.weight for s in mine)
    seats = cfg.rollout.groups_per_step
    short = []
    for s in mine:
        if s.max_concurrency is None or total <= 0:
            continue
        size = s.group_size or cfg.rollout.group_size
        want = s.weight / total * seats
        hold = math.ceil(s.max_concurrency / size)
        if want > hold:
            short.append((want / hold, s.name, want, hold, s.max_concurrency, size))
    if not short:
        return []
    _, name, want, hold, limit, size = max(short)
    return [f"scheduler: max_concurrency holds {len(short)} domain(s) below their share of a step, so "
            f"each step is filled from the domains that can go and the weights do not hold per step "
            f"(worst {name}: weight share {want:.2f} of the {seats} groups a step, but "
            f"max_concurrency = {limit} holds {hold} group(s) of {size} at a time); raise its "
            f"max_concurrency to at least {math.ceil(want) * size}"]


def quarantine_dirs(cfg: RunConfig) -> list[Path]:
    """Run directories whose `quarantine.json` training honours: those `[domains] quarantine`
    names (a run directory, or its quarantine.json) and the run's own (when `tasks noise`
    measured an earlier round of this run)."""
    out = []
    for p in map(Path, cfg.domains.quarantine):
        d = p.parent if p.name == QUARANTINE_FILE else p
        if not (d / QUARANTINE_FILE).is_file():
            raise ConfigError(f"domains.quarantine: {p}: no {QUARANTINE_FILE} there (write one with "
                              "`posttrain tasks noise RUN`)")
        out.append(d)
    own = cfg.run_dir
    return out + ([own] if (own / QUARANTINE_FILE).is_file() and own not in out else [])


def load_quarantines(dirs: Iterable[Path]) -> set[str]:
    hashes: set[str] = set()
    for d in dirs:
        try:
            hashes |= load_quarantine(d)
        except ValueError as e:
            raise ConfigError(f"domains.quarantine: {e}") from None
    return hashes


class SkipQuarantined:
    """A domain generator that never returns a quarantined task: seed s becomes the first of
    s, s', s'', ... (derived deterministically) whose task is not quarantined. Picklable, so the
    wrapped domain travels to Ray actors like any other."""

    def __init__(self, generate: object, hashes: frozenset[str], name: str) -> None:
        self.generate, self.hashes, self.name = generate, hashes, name
        self.skipped = 0

    def __call__(self, seed: int, split: Split) -> Task:
        for attempt in range(REDRAWS + 1):
            task: Task = self.generate(seed if attempt == 0 else _redraw(seed, attempt), split)  # type: ignore[operator]
            if task.hash not in self.hashes:
                return task
            self.skipped += 1
        raise RuntimeError(f"{self.name}: {REDRAWS + 1} tasks in a row are quarantined; remove the "
                           "domain from the run (its verifier is too noisy to train on)")


def _redraw(seed: int, attempt: int) -> int:
    return derive_seed(seed, "quarantine", attempt)


def signal_prior(before: Any, specs: Iterable[DomainSpec], group_size: int) -> dict[str, float]:
    """Domain -> the share of its groups (of its spec's `group_size`, else `group_size`, episodes)
    expected to have a reward spread, from the evaluation `before` (an `EvalResult` with its
    records: each task's scored samples give its pass rate); a domain without a scored sample is
    left out (no prior)."""
    from posttrain.scheduling.health import expected_signal

    group_sizes = {s.name: s.group_size or group_size for s in specs}
    counts: dict[str, list[tuple[int, int]]] = {}
    for r in before.records:
        if r.domain in group_sizes:
            scored = [s for s in r.by_index().values() if s.scored]
            counts.setdefault(r.domain, []).append((sum(bool(s.passed) for s in scored), len(scored)))
    out = {d: expected_signal(c, group_sizes[d]) for d, c in counts.items()}
    return {d: x for d, x in out.items() if x is not None}


def without_quarantined(domains: Sequence[Domain], hashes: set[str]) -> list[Domain]:
    """`domains`, each drawing around the quarantined tasks (unchanged when none is)."""
    if not hashes:
        return list(domains)
    frozen = frozenset(hashes)
    return [dataclasses.replace(d, generate=SkipQuarantined(d.generate, frozen, d.name)) for d in domains]


async def take_with_signal(sched: Any, rollout: Any) -> tuple[list[Any], int]:
    """One trainer step's groups, and how many takes of `groups_per_step` it made.

    Dynamic sampling (DAPO's; verl's `filter_groups`): while fewer than `[rollout] signal_groups`
    of the groups have a reward spread, take `groups_per_step` more, at most `max_takes` times.
    Where a base model's skill is latent (pass@1 far below pass@k), most groups are all-fail and
    carry no GRPO gradient, and a step made of one or two groups moves the weights on a handful of
    tokens; this keeps each update's batch of signal near the size asked for. The extra groups are
    generated by the same policy version (`Scheduler.take_more` extends the staleness bound's
    admissions for this update). Every group taken is stored and trained on as usual (zero-variance
    ones contribute nothing). A scheduler that stalls after the first take ends the search with
    what it has."""
    from posttrain.scheduling import SchedulerStalled

    groups = list(await sched.take(rollout.groups_per_step))
    takes = 1
    while (rollout.signal_groups and groups and takes < rollout.max_takes
           and sum(g.has_signal for g in groups) < rollout.signal_groups):
        try:
            more = await sched.take_more(rollout.groups_per_step)
        except SchedulerStalled:
            break
        if not more:
            break
        groups += more
        takes += 1
    return groups, takes
