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
* with `--confirm-worst K` (also on a `--resume` of a finished run): the K learnable domains
  whose deltas were lowest (the focus deltas when measured, else the run's) evaluated again on
  `--confirm-tasks` fresh eval tasks each by both weights (`confirm_figures`): `confirm_domains`
  (per domain its delta, task-bootstrap interval, discordant pairs, paired-A/B regression),
  `confirm_worst_delta` (and `_domain`, `_ci`), `confirm_regressions`. The worst of many small
  readings is biased low by being chosen; a fresh, larger reading of the chosen is not.
  `settled_worst_delta` (and `_domain`): the lowest of every learnable domain's delta on its
  largest evaluation (the confirmation's for the K, the focus reading -- else the run's -- for
  the others), so a domain the confirmation did not choose still counts;
* `max_answer_rise` (and `_domain`, and the 5 largest in `answer_rises`; `focus_*` on the focus
  evaluations): per learnable domain, how much the share of the trained policy's commonest
  answer rose from the base evaluation (`posttrain.evaluation.shortcuts`). A constant answer that
  pays somewhere and is carried to look-alike prompts shows here;
* `targets`: each of the issue's targets read from the figures above, with whether it is met
  (None where not measured): `worst_delta` at the run's evaluation size and, where the lowest
  domains were confirmed, `confirm_worst_delta` and `settled_worst_delta`: the worst of ~40
  readings at 4 tasks x 8 samples is below -0.02 for an unchanged policy (`null_worst_delta`),
  so the two-stage reading (screen every domain, read the lowest again on fresh tasks) is the
  one that can meet it;
* `wall_s`: the whole run (evaluations included); a run continued with `--resume` after a kill
  sums its segments (`segments` counts them; the time between them is not counted). `--resume`
  with a larger `--steps` trains a finished run further (`extended_from` lists its earlier step
  counts; the trained weights' evaluations are made again, and the confirmation reads the lowest
  domains of the new focus reading: an evaluation of the same name over other tasks is not
  loaded). The focus evaluations run in a second process beside the run (`focus_beside`, with
  the torch threads the run leaves: 1 on 2 cores, see `benchmarks/colocation.py`): the
  starting weights' once the base evaluation has named the learnable domains, the trained
  weights' once the last checkpoint is written; this process then loads them
  (`focus_beside_exit`: that process's exit status). They are not in `wall_s`: `focus_wait_s` is
  how long this process waited for them after the run, `focus_s` what it spent on them itself
  (~0 where they were loaded).
* with `--base-from EARLIER_RUNS_DIR` (an A/B of two training settings): the evaluations of the
  starting weights (base, focus, confirmation) copy the samples that earlier run of the
  benchmark drew of the same tasks, where it drew them with the same weights, sampling settings
  and posttrain source (`[eval] base_from`); `reused` says how many each evaluation copied. The
  figures are those of a run that drew them itself; `wall_s` is shorter by what was not drawn.

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

from breadth_evals import (
    ab_counts,
    answer_rises,
    confirm_figures,
    die_with_parent,
    focus_beside,
    focus_figures,
    null_deltas,
    pass1_deltas,
)
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


def _step_number(version: str) -> int:
    tail = version.rsplit("step-", 1)[-1]
    return int(tail) if tail.isdigit() else -1


TARGETS = (("domains_trained", ">=", 300), ("infra_error_rate", "<=", 0.01),
           ("step_mix_error", "<=", 0.05), ("mean_delta", ">=", 0.05), ("focus_mean_delta", ">=", 0.05),
           ("worst_delta", ">=", -0.02), ("confirm_worst_delta", ">=", -0.02),
           ("settled_worst_delta", ">=", -0.02),
           ("heldout_delta", ">=", -0.01))
"""the figures the breadth issue sets targets for (the focus and confirmation readings are the
same figures measured on more tasks)"""


def targets(figures: dict) -> dict[str, bool | None]:
    """"figure op bound" -> whether the figure meets it; None where it was not measured."""
    out: dict[str, bool | None] = {}
    for key, op, bound in TARGETS:
        value = figures.get(key)
        out[f"{key} {op} {bound}"] = (None if value is None
                                      else value >= bound if op == ">=" else value <= bound)
    return out


def reused_samples(run_dir: Path) -> dict[str, int]:
    """Evaluation name -> samples it copied from `--base-from`'s run (`EvalResult.reused`)."""
    from posttrain.evaluation.result import run_evals

    return {r.name: r.reused["samples"] for r in run_evals(run_dir) if r.reused}


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
    paths = {}
    if not Path(cfg.model.path).is_absolute():  # the config's paths are relative to the repository
        paths[("model", "path")] = str(ROOT / cfg.model.path)
    if args.base_from:  # the earlier run's directory in its --runs-dir
        paths[("eval", "base_from")] = str(Path(args.base_from) / cfg.name)
    return load_config(args.config, {**keyed, **paths}) if paths else cfg


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
    ap.add_argument("--confirm-worst", type=int, default=0, metavar="K",
                    help="then evaluate the K learnable domains with the lowest deltas (the focus "
                         "ones' when measured) again on --confirm-tasks fresh eval tasks each, before "
                         "and after (the confirm_* figures; may be added on --resume)")
    ap.add_argument("--confirm-tasks", type=int, default=200)
    ap.add_argument("--base-from", default=None, metavar="RUNS_DIR",
                    help="copy the starting weights' evaluations (base, focus, confirmation) from this "
                         "earlier run of the benchmark where they are the same ones ([eval] base_from): "
                         "an A/B of two training settings evaluates the base once")
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
    if args.base_from and Path(args.base_from).resolve() == runs.resolve():
        ap.error("--base-from names --runs-dir itself (which this run replaces)")
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
                                              if k not in ("focus_tasks", "focus_beside", "base_from",
                                                           "confirm_worst", "confirm_tasks")
                                              and not (k == "set" and not v)})
    cfg = _config(args, sets, runs)
    console = Console(force_terminal=False, width=120)
    job = Job(cfg, console)
    ended.unlink(missing_ok=True)
    beside = None
    if args.focus_tasks:  # the focus evaluations, beside the run (`focus_beside`)
        with open(runs / "focus-beside.err", "ab") as err:
            beside = subprocess.Popen([sys.executable, __file__, *sys.argv[1:], "--focus-beside"],
                                      stdout=subprocess.DEVNULL, stderr=err, preexec_fn=die_with_parent)
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
    by_domain = pass1_deltas(before, after, learnable)
    deltas = list(by_domain.values())
    groups: Counter = Counter()
    for c in per_step:
        groups.update(c)  # adds the step's counts
    signal = mix["signal"]
    held = list(pass1_deltas(before, after, [d.name for d in job.heldout_domains]).values())
    null = null_deltas(before, learnable)
    regressions, improvements = ab_counts(before, after, learnable)
    families = Counter(d.split(".")[0] for d in served)
    focus = focus_figures(job, learnable, args.focus_tasks)
    confirm = confirm_figures(job, focus.pop("deltas", None) or by_domain, args.confirm_worst,
                              args.confirm_tasks, max(args.tasks_per_domain, args.focus_tasks))
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
        **focus, **confirm,
        "reused": reused_samples(cfg.run_dir),
        "focus_beside_exit": beside_rc, "focus_wait_s": round(focus_wait_s, 1),
        "wall_s": round(wall_s, 1),
        "segments": len(segments["segments"]),
        "extended_from": segments.get("extended_from", []),
        "contamination_overridden": json.loads((cfg.run_dir / "contamination.json").read_text())["overridden"],
    }
    out["targets"] = targets(out)
    table = Table(title=f"breadth: {len(trained)} trained domains, {cfg.steps} steps (shortened)")
    table.add_column("figure")
    table.add_column("value", justify="right")
    for key, value in out.items():
        if key != "targets":
            table.add_row(key, f"{value:.4f}" if isinstance(value, float) else str(value))
    for key, met in out["targets"].items():
        table.add_row(f"target {key}", {True: "met", False: "NOT met", None: "not measured"}[met])
    console.print(table)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
