"""Hundreds of domains in one run: `configs/breadth.toml` (every domain the model fits), shortened.

    .venv/bin/python benchmarks/breadth.py [--steps 4] [--tasks-per-domain 4] [--samples 4]
    .venv/bin/python benchmarks/breadth.py --config configs/breadth-agent.toml   # with tiny-agent

Runs the job in-process with the overrides below, then reports, from the run directory:

* `domains_trained`: trained domains that got at least one group into an update;
* `infra_error_rate`: infrastructure errors over all episodes of the run (training and evaluation);
* `step_mix_error`: per domain, the largest |its share of a step's groups - its quota| over the
  steps, averaged over trained domains; the quota is the share the scheduler held for it when the
  step began: its weight's share of the trained tier, scaled by `[scheduler.adaptive]` (recent
  groups without a reward spread lower it; replayed from the stored groups, `step_mix`);
  `step_family_error`: the same per family (the sum of its domains' quotas), the worst step;
  `*_configured`: both against the configured weights alone; `above_floor_share` /
  `above_floor_quota`: the domains whose adaptive weight is above the floor at a step, their share
  of the step's groups and their quotas' sum, averaged over the steps (the per-domain error is
  mostly rounding with hundreds of domains; this one shows whether the weights were served);
* `mean_delta`: pass@1 after - before, averaged over trained domains whose base pass@k >= 0.2;
  `worst_delta`: the smallest such delta; `heldout_delta`: the held-out domains' mean delta;
* what sampling noise alone makes of those figures: `null_worst_delta`, the smallest per-domain
  difference between the base evaluation's odd and even samples of the same tasks, scaled by
  1/sqrt 2 to the whole evaluation's sample size -- the worst delta two independent evaluations of
  one unchanged policy would show (the runner seeds sample j of a task alike under both policies,
  so a policy that changed little shows less noise than this; the more it changed, the closer its
  deltas' noise comes to it); and `significant_regressions` / `significant_improvements`, the
  learnable domains whose paired A/B comparison (`posttrain.evaluation.ab`: task bootstrap and
  Holm-corrected McNemar) finds a significant change;
* with `--focus-tasks N` (also on a `--resume` of a finished run): the learnable domains evaluated
  again on N eval tasks each by the base and the trained weights (`focus_evals`), and the same
  figures from them: `focus_mean_delta`, `focus_worst_delta` (and its domain),
  `focus_null_worst_delta`, `focus_significant_*`. At 4 tasks a domain the deltas carry the
  noise of which tasks were drawn, which the odd/even null cannot see: a policy that settled on
  one answer gains or loses by those few tasks' answers;
* `max_answer_rise` (and `_domain`, and the 5 largest in `answer_rises`; `focus_*` on the focus
  evaluations): per learnable domain, how much the share of the trained policy's commonest
  answer rose from the base evaluation (`posttrain.evaluation.shortcuts`). A constant answer that
  pays somewhere and is carried to look-alike prompts shows here;
* `wall_s`: the whole run (evaluations included); a run continued with `--resume` after a kill
  sums its segments (`segments` counts them; the time between them is not counted). `--resume`
  with a larger `--steps` trains a finished run further (`extended_from` lists its earlier step
  counts). The focus evaluations run in a second process beside the run (`focus_beside`): the
  starting weights' once the base evaluation has named the learnable domains, the trained
  weights' once the last checkpoint is written; this process then loads them
  (`focus_beside_exit`: that process's exit status). They are not in `wall_s`: `focus_wait_s` is
  how long this process waited for them after the run, `focus_s` what it spent on them itself
  (~0 where they were loaded).

Shortened how: `--steps` trainer steps instead of the config's, `--tasks-per-domain` eval tasks
per domain and `--samples` samples each (and `--group-size` samples per training group), so on a
loaded CPU machine the run takes minutes; the deltas of a few steps are small and noisy (each
domain is seen by a step or two). Prints a table, then one JSON line.

The full-size run (`--config configs/breadth-agent.toml --steps 40 --tasks-per-domain 10
--samples 8`) takes hours on a 2-core machine: kill it when you must and start it again with the
same flags and `--resume`; the job continues where it stopped (its evaluations included).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

from rich.console import Console
from rich.table import Table

from posttrain.pipeline.config import ConfigError, dotted, load_config, parse_set
from posttrain.pipeline.main import Job
from posttrain.pipeline.mix import domain_specs, signal_prior
from posttrain.pipeline.report import pass_of

ROOT = Path(__file__).resolve().parents[1]


def step_mix(store, run_id: str, weights: dict[str, float], adaptive, prior: dict[str, float] | None = None) -> dict:
    """The groups per domain of each step (a group's step is the policy version it was generated
    with: synchronous training, version N feeds step N + 1), and each step's quotas: the
    configured ones (weight / sum of weights) and the effective ones the scheduler held when the
    step began -- `[scheduler.adaptive]` scales a domain's weight by the share of its recent groups
    that had a reward spread (`posttrain.scheduling.health.SignalTracker`, replayed here over the
    groups of the earlier steps in the order they completed, from the base evaluation's `prior`
    when the run had `prior_groups`), a retired domain's quota is 0."""
    from posttrain.scheduling.health import SignalTracker
    from posttrain.scheduling.work import passed

    groups: dict[str, dict] = {}
    for t in store.trajectories(run_id=run_id, split="train"):
        if t.status == "infra_error" or not t.group_id:
            continue
        g = groups.setdefault(t.group_id, {"domain": t.domain, "step": _step_number(t.policy_version or ""),
                                           "rewards": [], "passed": [], "done": 0.0})
        g["rewards"].append(t.reward)
        g["passed"].append(passed(t))
        g["done"] = max(g["done"], t.created_at)
    steps = sorted({g["step"] for g in groups.values()})
    per_step = [Counter(g["domain"] for g in groups.values() if g["step"] == s) for s in steps]
    configured = {d: w / sum(weights.values()) for d, w in weights.items()}
    tracker = SignalTracker(adaptive)
    tracker.set_prior(prior or {})  # as `posttrain run` seeds it (ignored without `prior_groups`)
    history = sorted(groups.values(), key=lambda g: (g["step"], g["done"]))
    effective, boosted, i = [], [], 0
    for s in steps:
        while i < len(history) and history[i]["step"] < s:
            g = history[i]
            tracker.record(g["domain"], len(g["rewards"]) > 1 and max(g["rewards"]) != min(g["rewards"]),
                           all(g["passed"]))
            i += 1
        m = {d: tracker.multiplier(d) for d in weights}
        w = {d: 0.0 if d in tracker.retired else weights[d] * m[d] for d in weights}
        effective.append({d: x / sum(w.values()) for d, x in w.items()})
        boosted.append({d for d in weights if m[d] > adaptive.floor and d not in tracker.retired})
    spread = Counter(g["domain"] for g in groups.values()
                     if len(g["rewards"]) > 1 and max(g["rewards"]) != min(g["rewards"]))
    return {"per_step": [dict(c) for c in per_step], "configured": [configured] * len(per_step),
            "effective": effective, "above_floor": boosted, "signal": dict(spread)}


def above_floor(per_step: list[dict[str, int]], quotas: list[dict[str, float]],
                boosted: list[set[str]]) -> tuple[float, float]:
    """(share of the groups, share by the quotas) of the domains whose adaptive weight is above the
    floor at each step, averaged over the steps: what the adaptive weights were meant to give the
    domains with a reward spread, and what they got. `step_mix_error` cannot show this with
    hundreds of domains: a domain's quota is a fraction of one of a step's groups, so the
    per-domain error is mostly rounding."""
    if not per_step:
        return float("nan"), float("nan")
    got = [sum(k for d, k in c.items() if d in b) / sum(c.values()) for c, b in zip(per_step, boosted)]
    want = [sum(q[d] for d in b) for q, b in zip(quotas, boosted)]
    return sum(got) / len(got), sum(want) / len(want)


def mix_error(per_step: list[dict[str, int]], quotas: list[dict[str, float]]) -> float:
    """Per domain, the largest |its share of a step's groups - its quota at that step|, averaged."""
    if not per_step:
        return float("nan")
    names = quotas[0].keys()
    worst = {d: max(abs(c.get(d, 0) / sum(c.values()) - q[d]) for c, q in zip(per_step, quotas)) for d in names}
    return sum(worst.values()) / len(worst)


def family_mix(per_step: list[dict[str, int]], quotas: list[dict[str, float]]) -> float:
    """The largest |a family's share of a step's groups - the family's quota| over the steps."""
    worst = 0.0
    for c, q in zip(per_step, quotas):
        fquota: dict[str, float] = defaultdict(float)
        for d, x in q.items():
            fquota[d.split(".")[0]] += x
        fam: Counter = Counter()
        for d, k in c.items():
            fam[d.split(".")[0]] += k
        n = sum(c.values())
        worst = max([worst] + [abs(fam[f] / n - x) for f, x in fquota.items()])
    return worst


def _load_segments(path: Path, args: dict) -> dict:
    """The segments of this benchmark's run so far (none for a fresh one); a resume must repeat the
    flags it started with, or its figures would mix two runs -- except a larger `--steps`: the run
    is trained further from its last checkpoint (the trainer's learning rate is constant, so this
    is the longer run; its base evaluation is kept, its final one is made again), and the steps it
    had are listed in `extended_from`."""
    flags = {k: v for k, v in args.items() if k != "resume"}
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        return {"flags": flags, "segments": []}
    old = json.loads(path.read_text())
    if flags["steps"] > old["flags"]["steps"] and {**old["flags"], "steps": flags["steps"]} == flags:
        old["extended_from"] = [*old.get("extended_from", []), old["flags"]["steps"]]
        old["flags"] = flags
    if old["flags"] != flags:
        changed = sorted(k for k in flags.keys() | old["flags"].keys() if flags.get(k) != old["flags"].get(k))
        raise SystemExit(f"--resume: {path} was started with other flags ({', '.join(changed)}): "
                         f"{ {k: old['flags'].get(k) for k in changed} }")
    return old


class _Segment:
    """Adds this process's wall time to the run's segments, rewritten (atomically) every 30 s and at
    the end, so the sum survives a kill."""

    def __init__(self, path: Path, segments: dict):
        self.path, self.segments = path, segments
        self.t0 = time.perf_counter()
        self.seg = {"wall_s": 0.0}
        segments["segments"].append(self.seg)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._tick, daemon=True)

    def write(self) -> None:
        self.seg["wall_s"] = round(time.perf_counter() - self.t0, 1)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.segments))
        os.replace(tmp, self.path)

    def _tick(self) -> None:
        while not self._stop.wait(30):
            self.write()

    def __enter__(self) -> _Segment:
        self.write()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.write()


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


def focus_tasks(job: Job, learnable: list[str], n_tasks: int) -> tuple[list, list, int]:
    """`focus_evals`' domains and tasks: the first `n_tasks` eval tasks of each learnable domain,
    less those the contamination check finds in the training sample; and how many it left out."""
    from posttrain.evaluation.contamination import check_contamination
    from posttrain.pipeline.checks import eval_tasks, train_sample

    wanted = set(learnable)
    domains = [d for d in job.train_domains if d.name in wanted]
    tasks = eval_tasks(domains, n_tasks)
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
    from posttrain.pipeline.main import _policy
    from posttrain.scheduling.engine import sandbox_pool
    from posttrain.storage.store import Store

    cfg = job.config
    domains, tasks, leaked = focus_tasks(job, learnable, n_tasks)
    trainer, _ = job.make_trainer()
    with Store.for_run_dir(cfg.run_dir) as store, sandbox_pool(domains, cfg.scheduler.workers) as factory:
        before = job.evaluate(job._base_policy(), "focus-before", tasks, store, factory)
        after = job.evaluate(_policy(trainer), "focus-after", tasks, store, factory)
    return before, after, leaked


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
    from posttrain.evaluation.result import EvalResult
    from posttrain.pipeline.checks import unfit_domains
    from posttrain.pipeline.main import _policy
    from posttrain.scheduling.engine import sandbox_pool
    from posttrain.storage.store import Store
    from posttrain.training.trainer import Trainer

    cfg = job.config
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


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the parent dies (Linux prctl PR_SET_PDEATHSIG), so a
    killed benchmark leaves no evaluation running that its `--resume` would start a second time."""
    import ctypes
    import signal

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)


def focus_figures(job: Job, learnable: list[str], n_tasks: int) -> dict:
    """`focus_evals`' deltas (nothing without `n_tasks`): the same figures as the run's own, on
    more tasks a domain, with their null and paired A/B."""
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
            "focus_s": round(focus_s, 1)}


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


def _step_number(version: str) -> int:
    tail = version.rsplit("step-", 1)[-1]
    return int(tail) if tail.isdigit() else -1


def _config(args: argparse.Namespace, sets: dict, runs: Path):
    """The run config: `--config` with `--set`, and the benchmark's flags over both."""
    overrides = {"runs_dir": str(runs), "steps": args.steps, "checkpoint_every": max(1, args.steps),
                 "eval.tasks_per_domain": args.tasks_per_domain, "eval.samples": args.samples,
                 "logging.backends": []}
    if args.group_size:
        overrides["rollout.group_size"] = args.group_size
    if args.model:
        overrides["model.path"] = args.model
    if args.allow_contamination:
        overrides["allow_contamination"] = True
    keyed = {**sets, **dotted(overrides)}  # the flags win
    cfg = load_config(args.config, keyed)
    if not Path(cfg.model.path).is_absolute():  # the config's paths are relative to the repository
        cfg = load_config(args.config, {**keyed, ("model", "path"): str(ROOT / cfg.model.path)})
    return cfg


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=str(ROOT / "configs" / "breadth.toml"))
    ap.add_argument("--runs-dir", default="runs/bench-breadth",
                    help="where the run is written (replaced unless --resume)")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--tasks-per-domain", type=int, default=4)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=None,
                    help="samples per training group (default: the config's)")
    ap.add_argument("--model", default=None, help="starting model (default: the config's)")
    ap.add_argument("--allow-contamination", action="store_true",
                    help="run even if the contamination guard refuses (reported in the JSON line)")
    ap.add_argument("--focus-tasks", type=int, default=0,
                    help="then evaluate the learnable domains again on this many eval tasks each, "
                         "before and after (the focus_* figures; may be added on --resume)")
    ap.add_argument("--resume", action="store_true",
                    help="continue the run in --runs-dir (same flags) instead of starting again")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a run-config field, as `posttrain run --set` (e.g. trainer.replay_solved=4)")
    ap.add_argument("--focus-beside", action="store_true", help=argparse.SUPPRESS)  # the side process
    args = ap.parse_args()
    try:
        sets = parse_set(args.set)
    except ConfigError as e:
        ap.error(str(e))
    runs = Path(args.runs_dir)
    ended = runs / "bench-run-ended"  # written when this segment's run returns or fails
    if args.focus_beside:
        with open(runs / "focus-beside.log", "a", encoding="utf-8") as log:
            focus_beside(Job(_config(args, sets, runs), Console(file=log, force_terminal=False, width=120)),
                         args.focus_tasks, ended)
        return
    segments_file = runs / "bench-segments.json"
    if not args.resume:
        shutil.rmtree(runs, ignore_errors=True)
    elif not segments_file.exists():
        raise SystemExit(f"--resume: no run of this benchmark in {runs} ({segments_file.name} is missing)")
    # --focus-tasks measures the finished run again; it is no flag of the run itself
    # (no --set is no flag: a run measured before --set existed resumes as before)
    segments = _load_segments(segments_file, {k: v for k, v in vars(args).items()
                                              if k not in ("focus_tasks", "focus_beside")
                                              and not (k == "set" and not v)})
    cfg = _config(args, sets, runs)
    console = Console(force_terminal=False, width=120)
    job = Job(cfg, console)
    ended.unlink(missing_ok=True)
    beside = None
    if args.focus_tasks:  # the focus evaluations, beside the run (`focus_beside`)
        with open(runs / "focus-beside.err", "ab") as err:
            beside = subprocess.Popen([sys.executable, __file__, *sys.argv[1:], "--focus-beside"],
                                      stdout=subprocess.DEVNULL, stderr=err, preexec_fn=_die_with_parent)
    # each segment's seconds are written while it runs, so a kill loses at most a minute of them
    try:
        with _Segment(segments_file, segments):
            summary = job.run()
    finally:
        ended.touch()
    t_wait = time.perf_counter()
    beside_rc = beside.wait() if beside is not None else None
    focus_wait_s = time.perf_counter() - t_wait
    wall_s = sum(seg["wall_s"] for seg in segments["segments"])

    from posttrain.evaluation.result import EvalResult
    from posttrain.storage.store import Store

    before = EvalResult.load(cfg.run_dir / "evals" / "before.json")
    after = EvalResult.load(cfg.run_dir / "evals" / "after.json")
    k = cfg.eval.n_samples
    trained = [d.name for d in job.train_domains]
    weights = {s: cfg.domains.weights.get(s, 1.0) for s in trained}
    with Store.for_run_dir(cfg.run_dir, readonly=True) as store:
        counts = store.counts()
        prior = signal_prior(before, domain_specs(cfg, job.train_domains, left_out=job.unfit), cfg.rollout.group_size)
        mix = step_mix(store, cfg.name, weights, cfg.scheduler.adaptive, prior)
    per_step = mix["per_step"]
    floor_share, floor_quota = above_floor(per_step, mix["effective"], mix["above_floor"])
    served = {d for c in per_step for d in c}

    learnable = [d for d in trained if (pass_of(before, d, f"pass@{k}") or 0) >= 0.2]
    deltas = list(pass1_deltas(before, after, learnable).values())
    groups: Counter = Counter()
    for c in per_step:
        groups.update(c)  # adds the step's counts
    signal = mix["signal"]
    held = list(pass1_deltas(before, after, [d.name for d in job.heldout_domains]).values())
    null = null_deltas(before, learnable)
    regressions, improvements = ab_counts(before, after, learnable)
    families = Counter(d.split(".")[0] for d in served)
    out = {
        "domains_trained": len(served),
        "domains_selected": len(trained) + len(job.unfit),
        "domains_unfit": len(job.unfit),
        "families": dict(sorted(families.items())),
        "steps": cfg.steps,
        "set": args.set,
        "groups_per_step": cfg.rollout.groups_per_step,
        "infra_error_rate": counts["infra_error"] / counts["episodes"] if counts["episodes"] else None,
        "step_mix_error": round(mix_error(per_step, mix["effective"]), 4),
        "step_family_error": round(family_mix(per_step, mix["effective"]), 4),
        "step_mix_error_configured": round(mix_error(per_step, mix["configured"]), 4),
        "above_floor_share": round(floor_share, 4), "above_floor_quota": round(floor_quota, 4),
        "step_family_error_configured": round(family_mix(per_step, mix["configured"]), 4),
        "step_families_max": max((len({d.split(".")[0] for d in c}) for c in per_step), default=0),
        "step_families_min": min((len({d.split(".")[0] for d in c}) for c in per_step), default=0),
        "learnable_domains": len(learnable),
        # what the learnable domains were trained on: their groups, and those with a reward spread
        # (the only ones that move a GRPO policy), against all of the run's
        "learnable_groups": sum(groups[d] for d in learnable), "groups": sum(groups.values()),
        "learnable_signal_groups": sum(signal.get(d, 0) for d in learnable),
        "signal_groups": sum(signal.values()),
        "mean_delta": sum(deltas) / len(deltas) if deltas else None,
        "worst_delta": min(deltas) if deltas else None,
        "heldout_delta": sum(held) / len(held) if held else None,
        "null_worst_delta": min(null.values()) if null else None,
        "null_mean_delta": sum(null.values()) / len(null) if null else None,
        "significant_regressions": regressions,
        "significant_improvements": improvements,
        **answer_rises(cfg.run_dir, "before", "after", learnable),
        "base_pass1": summary.get("base_pass1"), "final_pass1": summary.get("final_pass1"),
        **focus_figures(job, learnable, args.focus_tasks),
        "focus_beside_exit": beside_rc, "focus_wait_s": round(focus_wait_s, 1),
        "wall_s": round(wall_s, 1),
        "segments": len(segments["segments"]),
        "extended_from": segments.get("extended_from", []),
        "contamination_overridden": json.loads((cfg.run_dir / "contamination.json").read_text())["overridden"],
    }
    table = Table(title=f"breadth: {len(trained)} trained domains, {cfg.steps} steps (shortened)")
    table.add_column("figure")
    table.add_column("value", justify="right")
    for key, value in out.items():
        table.add_row(key, f"{value:.4f}" if isinstance(value, float) else str(value))
    console.print(table)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
