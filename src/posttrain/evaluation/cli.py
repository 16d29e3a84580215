"""`posttrain eval` (run, compare, baseline) and `posttrain report`. Thin: parse arguments, call
the library, print. Nothing heavy is imported at module level (torch loads only when a model
policy is chosen). The evaluation layer's `tasks` sub-commands are in `tasks_cli`."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import NoReturn

import typer

from posttrain.cli_params import non_negative, share, significance
from posttrain.evaluation.tasksets import is_task_file
from posttrain.tasks.sources.cli import apply_sources, source_option

app = typer.Typer(add_completion=False, help="Evaluate a policy on the eval split; compare two; gate on a baseline.")
baseline_app = typer.Typer(no_args_is_help=True, add_completion=False, help="Frozen regression baselines.")
app.add_typer(baseline_app, name="baseline")

DEFAULT_TASKS = "math.*,text.*"


def fail(message: str, code: int = 2) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def _config(k: str, per_domain: int, temperature: float, seed: int, workers: int, ci: str):
    from pydantic import ValidationError

    from posttrain.evaluation.config import EvalConfig
    from posttrain.settings import error_lines

    options = {"tasks_per_domain": "per-domain"}  # EvalConfig fields named unlike their option
    try:
        return EvalConfig(k=EvalConfig.parse_k(k), tasks_per_domain=per_domain, temperature=temperature,
                          seed=seed, workers=workers, ci=ci)  # type: ignore[arg-type]
    except ValidationError as e:  # one line per option, not pydantic's report
        lines = error_lines(e)
        fail("; ".join("--" + options.get(line.split(":")[0], line.split(":")[0]) + ":" + line.split(":", 1)[1]
                        for line in lines))
    except ValueError as e:
        fail(str(e))


def _policy(spec: str, run_dir: Path | None, mode: str = "standard"):
    from posttrain.evaluation.policy import PolicySpecError, resolve_policy

    try:
        return resolve_policy(spec, run_dir, mode)
    except (PolicySpecError, ValueError, ImportError) as e:
        fail(f"--policy: {e}")


def _tasks(spec: str, per_domain: int):
    from posttrain.evaluation.tasksets import TaskSetError, resolve_tasks

    try:
        return resolve_tasks(spec, per_domain)
    except (TaskSetError, OSError) as e:
        fail(f"--tasks: {e}")


def _store(run_dir: Path | None):
    if run_dir is None:
        return None
    from posttrain import runlock
    from posttrain.storage.store import Store, StoreError

    runlock.acquire(run_dir, "posttrain eval")  # one writer per run directory (UserError if taken)
    try:
        return Store.for_run_dir(run_dir)
    except StoreError as e:
        fail(str(e))


def _eval_name(name: str, run_dir: Path | None, store, policy: str, resume: bool = False) -> str:
    """The eval's name in `run_dir`: a given `--name` that is taken is refused (its rows and
    `evals/NAME.json` are another eval's) unless `--resume` asks to continue it; the default
    name gets a free suffix."""
    import time

    from posttrain.evaluation.result import EVALS_DIR, safe_name

    if resume and (run_dir is None or not name):
        fail("--resume needs --run-dir and the --name of the evaluation to continue")
    if run_dir is None:
        return name
    taken = {r["id"].removeprefix("eval:") for r in store.runs() if r["id"].startswith("eval:")}
    if resume:
        if name not in taken:
            fail(f"--resume: {run_dir} holds no evaluation named {name!r} to continue")
        return name
    taken |= {p.stem for p in (run_dir / EVALS_DIR).glob("*.json")}
    if name:
        if name in taken or safe_name(name) in taken:
            fail(f"--name: an eval named {name!r} already exists in {run_dir} "
                  f"({EVALS_DIR}/{safe_name(name)}.json or its stored rows); choose another name, "
                  "or --resume to continue an evaluation that was cut short")
        return name
    base = f"{policy}-{time.strftime('%Y%m%d-%H%M%S')}"
    fresh, n = base, 1
    while fresh in taken or safe_name(fresh) in taken:
        n += 1
        fresh = f"{base}-{n}"
    return fresh


def _console():
    from rich.console import Console

    console = Console()
    # piped output: rich assumes 80 columns and would squeeze the tables into ellipses
    return console if console.is_terminal else Console(width=160)


def infra_error_causes(records) -> dict[str, tuple[int, str]]:
    """Domain -> (episodes, error) of its most frequent infrastructure error: a score that
    leaves episodes out must say why."""
    import re
    from collections import Counter

    per: dict[str, Counter] = {}
    example: dict[tuple[str, str], str] = {}
    for r in records:
        for smp in r.samples:
            if smp.error:  # errors that differ only in their numbers are one cause
                kind = re.sub(r"\d+", "N", smp.error)
                per.setdefault(r.domain, Counter())[kind] += 1
                example.setdefault((r.domain, kind), smp.error)
    out = {}
    for d, c in sorted(per.items()):
        kind, n = c.most_common(1)[0]
        out[d] = (n, example[(d, kind)])
    return out


def _print_result(result) -> None:
    from rich.table import Table

    s, ks = result.summary, result.config.k
    table = Table(title=f"{result.name}: {result.policy}")
    table.add_column("domain", no_wrap=True)
    for col in ("n", *[f"pass@{k}" for k in ks], "95% CI", "trunc", "infra", "rework", "tok/ep", "s/ep", "p50 s"):
        table.add_column(col, justify="right", no_wrap=True)

    def pct(x: float | None) -> str:
        return "–" if x is None else f"{100 * x:.1f}%"

    def num(x: float | None) -> str:
        return "–" if x is None else f"{x:.3f}"
    for d, v in s["domains"].items():
        per, p1 = v["cost"]["per_episode"], v["pass@1"]
        ci = "–" if p1["ci"] is None else f"{p1['ci'][0]:.2f}-{p1['ci'][1]:.2f}"
        table.add_row(d, str(v["tasks"]), *[num(v[f"pass@{k}"]["value"]) for k in ks], ci,
                      pct(v["truncation_rate"]), pct(v["infra_error_rate"]),
                      pct(v["rework"]["rework_rate"]) if v["rework"] else "–",
                      f"{per['prompt_tokens'] + per['output_tokens']:.0f}"
                      f"{'*' if v['cost']['tokens_estimated'] else ''}",
                      f"{per['gen_s'] + per['sandbox_s']:.3f}", num(v["latency_s"]["p50"]))
    fams = Table("family", "domains", "tasks", "macro pass@1", "micro pass@1 [95% CI]", "trunc", "infra",
                 "tok/ep", "s/ep", "p50/p90 s", title="families")
    for f, v in s["families"].items():
        ci, per, lat = v["micro_pass1_ci"], v["cost"]["per_episode"], v["latency_s"]
        micro = pct(v["micro_pass1"]) + ("" if ci is None or v["micro_pass1"] is None
                                         else f" [{pct(ci[0])}, {pct(ci[1])}]")
        fams.add_row(f, str(v["domains"]), str(v["tasks"]), pct(v["macro_pass1"]), micro, pct(v["truncation_rate"]),
                     pct(v["infra_error_rate"]), f"{per['prompt_tokens'] + per['output_tokens']:.0f}",
                     f"{per['gen_s'] + per['sandbox_s']:.3f}", f"{num(lat['p50'])}/{num(lat['p90'])}")
    console = _console()
    console.print(table)
    console.print(fams)
    errors = infra_error_causes(result.records)
    if errors:
        console.print("infrastructure errors (excluded from scores), most frequent cause per domain:", highlight=False)
        for domain, (n, cause) in errors.items():
            console.print(f"  {domain}: {n}x {cause}", highlight=False, soft_wrap=True)
    console.print(f"macro pass@1 {pct(s['macro_pass1'])}, micro pass@1 {pct(s['micro_pass1'])}, infra errors "
                  f"{pct(s['infra_error_rate'])} (excluded from scores), {s['episodes']} episodes in "
                  f"{result.wall_s:.1f}s"
                  + ("; * tokens estimated from characters" if s["cost"]["tokens_estimated"] else ""),
                  highlight=False)


@app.callback(invoke_without_command=True)
def eval_(ctx: typer.Context,
          policy: str | None = typer.Option(None, "--policy", help="oracle|empty|wrong, a model directory, "
                                               "openai:URL#MODEL, or a policy version of --run-dir"),
          tasks: str = typer.Option(DEFAULT_TASKS, "--tasks",
                                    help="domain globs, a frozen task-set file, or a task file"),
          k: str = typer.Option("1", "--k", help="pass@k values, e.g. '1,8' (n samples per task = max k)"),
          run_dir: Path | None = typer.Option(None, "--run-dir",
                                              help="store trajectories and write RUN/evals/NAME.json"),
          name: str = typer.Option("", "--name", help="eval name (default: policy name + time)"),
          per_domain: int = typer.Option(20, "--per-domain", min=1, help="eval tasks per domain for domain globs"),
          temperature: float = typer.Option(1.0, "--temperature", callback=non_negative, help="sampling temperature"),
          seed: int = typer.Option(0, "--seed", help="base sampling seed"),
          workers: int = typer.Option(2, "--workers", min=1, help="episodes stepped in parallel"),
          ci: str = typer.Option("wilson", "--ci", help="confidence intervals: wilson or bootstrap"),
          baseline: Path | None = typer.Option(None, "--baseline", help="exit 1 on a significant regression "
                                                  "against this baseline file"),
          max_infra_rate: float = typer.Option(0.05, "--max-infra-rate", callback=share,
                                               help="exit 3 when more than this share of episodes are "
                                                    "infrastructure errors (or a domain has nothing else)"),
          as_json: bool = typer.Option(False, "--json", help="print JSON"),
          resume: bool = typer.Option(False, "--resume", help="continue the evaluation --name of --run-dir "
                                      "that was cut short: its stored samples are not drawn again"),
          mode: str = typer.Option("standard", "--mode",
                                   help="standard, or fast (speculative decoding; model directories)"),
          threads: int = typer.Option(0, "--threads", min=0,
                                      help="torch CPU threads (0: torch's default, every core); beside another "
                                           "torch process keep the two's threads within the cores"),
          source: list[str] | None = source_option()) -> None:
    """Evaluate a policy: per-domain and per-family pass@k with CIs, rework, cost, latency.

    Exit codes: 0 done; 2 bad input; 3 not trustworthy (a domain with infrastructure errors on
    every episode, or more than --max-infra-rate of them overall; the reasons are printed)."""
    if ctx.invoked_subcommand is not None:
        return
    if policy is None:
        fail("--policy is required (e.g. --policy oracle); see `posttrain eval --help`")
    if threads:  # before any thread runs an op: generation threads take the count when they start
        import torch

        torch.set_num_threads(threads)
    added = apply_sources(source)
    if added and tasks == DEFAULT_TASKS:  # --source alone: evaluate what it adds
        tasks = ",".join(added)
    if baseline is not None:
        return _gate(policy, baseline, run_dir, name, as_json)
    from posttrain.errors import EXIT_UNTRUSTWORTHY
    from posttrain.evaluation.runner import run_eval
    from posttrain.evaluation.trust import untrustworthy

    config = _config(k, per_domain, temperature, seed, workers, ci)
    task_list = _tasks(tasks, per_domain)
    pol = _policy(policy, run_dir, mode)
    store = _store(run_dir)
    name = _eval_name(name, run_dir, store, pol.version.name, resume)
    from posttrain.tasks.sources import absolute

    try:
        result = run_eval(pol, task_list, config, name=name, policy_spec=policy, task_source=tasks, store=store,
                          resume=resume, sources=[absolute(s) for s in source or []])
    except ValueError as e:  # --resume of samples that are not this evaluation's
        fail(f"--resume: {e}" if resume else str(e))
    if run_dir is not None:
        path = result.save_to_run(run_dir)
        store.close()
        if not as_json:
            typer.echo(f"wrote {path}")
    reasons = untrustworthy(result.summary, max_infra_rate)
    if as_json:
        typer.echo(json.dumps({**result.brief(), "untrustworthy": reasons}))
    else:
        _print_result(result)
    if reasons:
        typer.echo("not trustworthy:\n  " + "\n  ".join(reasons), err=True)
        raise typer.Exit(EXIT_UNTRUSTWORTHY)


def _gate(policy: str, baseline_path: Path, run_dir: Path | None, name: str, as_json: bool) -> None:
    from posttrain.evaluation.baseline import Baseline, gate

    try:
        base = Baseline.load(baseline_path)
    except ValueError as e:
        fail(str(e))
    pol = _policy(policy, run_dir)
    store = _store(run_dir)
    outcome = gate(base, pol, name=name, policy_spec=policy, store=store)
    if run_dir is not None:
        outcome.candidate.save_to_run(run_dir)
        outcome.report.save_to_run(run_dir, f"{outcome.candidate.name}-vs-baseline")
        store.close()
    if as_json:
        typer.echo(json.dumps({"passed": outcome.passed, "regressions": outcome.report.regressions,
                               **outcome.candidate.brief(), "ab": outcome.report.to_dict()}))
    else:
        for line in outcome.lines():
            typer.echo(line)
    raise typer.Exit(0 if outcome.passed else 1)


def _load_side(spec: str, run_dir: Path | None):
    """An EvalResult when `spec` is an eval file or a saved eval name of --run-dir, else None."""
    from posttrain.evaluation.result import EVALS_DIR, EvalResult, safe_name

    candidates = [Path(spec)]
    if run_dir is not None:
        candidates.append(run_dir / EVALS_DIR / f"{safe_name(spec)}.json")
    for path in candidates:
        if is_task_file(path):
            try:
                return EvalResult.load(path)
            except ValueError as e:
                fail(str(e))
    return None


@app.command()
def compare(a: str = typer.Argument(..., help="A: a policy (as for --policy), an eval result file, or an eval "
                                    "name saved in --run-dir"),
            b: str = typer.Argument(..., help="B: likewise; differences are B minus A"),
            tasks: str = typer.Option(DEFAULT_TASKS, "--tasks", help="task set when both sides are policies"),
            k: str = typer.Option("1", "--k", help="pass@k values when both sides are run"),
            per_domain: int = typer.Option(20, "--per-domain", min=1),
            temperature: float = typer.Option(1.0, "--temperature", callback=non_negative),
            seed: int = typer.Option(0, "--seed"),
            workers: int = typer.Option(2, "--workers", min=1),
            alpha: float = typer.Option(0.05, "--alpha", callback=significance, help="significance level"),
            run_dir: Path | None = typer.Option(None, "--run-dir", help="save results and RUN/ab/A-vs-B.json"),
            fail_on_regression: bool = typer.Option(False, "--fail-on-regression",
                                                    help="exit 1 on a significant regression"),
            as_json: bool = typer.Option(False, "--json", help="print JSON")) -> None:
    """Paired A/B on identical tasks, seeds, prompts and tools: per-domain and overall
    differences with paired-bootstrap CIs and exact McNemar tests; regressions are flagged."""
    from posttrain.evaluation.ab import compare as ab_compare
    from posttrain.evaluation.runner import run_eval
    from posttrain.evaluation.tasksets import TaskSetError, tasks_of_records

    sides = [_load_side(a, run_dir), _load_side(b, run_dir)]
    loaded = next((s for s in sides if s is not None), None)
    store = _store(run_dir)
    if loaded is not None:
        config = loaded.config
        try:
            task_list = tasks_of_records(loaded.records, store)
        except TaskSetError as e:
            fail(str(e))
    else:
        config = _config(k, per_domain, temperature, seed, workers, "wilson")
        task_list = _tasks(tasks, per_domain)
    for i, spec in enumerate((a, b)):
        if sides[i] is None:
            sides[i] = run_eval(_policy(spec, run_dir), task_list, config, policy_spec=spec,
                                task_source=tasks if loaded is None else f"tasks of {loaded.name}",
                                name=f"{'AB'[i]}-{spec}" if loaded is None else "", store=store)
            if run_dir is not None:
                sides[i].save_to_run(run_dir)
    try:
        report = ab_compare(sides[0], sides[1], alpha=alpha, confidence=config.confidence,
                            bootstrap_samples=config.bootstrap_samples, seed=config.seed)
    except ValueError as e:
        fail(str(e))
    if run_dir is not None:
        report.save_to_run(run_dir)
        store.close()
    if as_json:
        typer.echo(json.dumps(report.to_dict()))
    else:
        _print_ab(report)
    raise typer.Exit(1 if fail_on_regression and report.regressions else 0)


def _print_ab(report) -> None:
    from rich.table import Table

    table = Table("domain", "tasks", "A", "B", "B-A [95% CI]", "A only/B only", "p (Holm)", "",
                  title=f"A/B: {report.b} minus {report.a}")
    rows = list(report.domains.items()) + [("overall (macro)", report.overall)]
    for d, v in rows:
        flag = "[red]REGRESSION[/red]" if v["regression"] else ("[green]better[/green]" if v["improvement"] else "")
        table.add_row(d, str(v["tasks"]), f"{v['pass1_a']:.3f}", f"{v['pass1_b']:.3f}",
                      f"{v['diff']:+.3f} [{v['ci'][0]:+.3f},{v['ci'][1]:+.3f}]", f"{v['a_only']}/{v['b_only']}",
                      f"{v.get('p_holm', v['mcnemar_p']):.3g}", flag)
    console = _console()
    console.print(table)
    for w in report.warnings:
        console.print(f"[yellow]warning[/yellow]: {w}", highlight=False)


@baseline_app.command("create")
def baseline_create(policy: str = typer.Option(..., "--policy", help="the version whose verdicts are frozen"),
                    out: Path = typer.Option(..., "--out", help="baseline file to write"),
                    tasks: str = typer.Option(DEFAULT_TASKS, "--tasks", help="domain globs or a task-set file"),
                    size: int = typer.Option(100, "--size", min=1, help="tasks to freeze, spread over domains "
                                             "(50..200 is a good range)"),
                    k: str = typer.Option("1", "--k", help="pass@k values (n samples per task = max k)"),
                    temperature: float = typer.Option(1.0, "--temperature", callback=non_negative),
                    seed: int = typer.Option(0, "--seed"),
                    workers: int = typer.Option(2, "--workers", min=1),
                    run_dir: Path | None = typer.Option(None, "--run-dir", help="to resolve a policy version name"),
                    as_json: bool = typer.Option(False, "--json")) -> None:
    """Freeze a task set and a policy version's verdicts into a baseline file."""
    from posttrain.evaluation.baseline import create_baseline
    from posttrain.tasks.registry import RegistryError, match_domains

    per_domain = 20
    if not is_task_file(tasks):
        try:
            per_domain = max(1, math.ceil(size / len(match_domains(tasks))))
        except RegistryError as e:
            fail(f"--tasks: {e}")
    config = _config(k, per_domain, temperature, seed, workers, "wilson")
    try:
        base = create_baseline(_policy(policy, run_dir), _tasks(tasks, per_domain), size, config,
                               policy_spec=policy, task_source=tasks)
    except ValueError as e:
        fail(str(e))
    base.save(out)
    s = base.result.summary
    if as_json:
        typer.echo(json.dumps({"path": str(out), "tasks": len(base.tasks), "macro_pass1": s["macro_pass1"],
                               "micro_pass1": s["micro_pass1"], "infra_error_rate": s["infra_error_rate"]}))
    else:
        typer.echo(f"wrote {out}: {len(base.tasks)} tasks over {len(s['domains'])} domains, "
                   f"{base.result.policy} macro pass@1 {s['macro_pass1']:.3f}")


def report(run_dir: Path = typer.Argument(..., help="a run directory"),
           out: Path | None = typer.Option(None, "--out", help="HTML file (default RUN/report.html)")) -> None:
    """Write a self-contained HTML report of a run: learning curves, evals, A/B, forgetting, noise."""
    from posttrain.evaluation.report import build_report

    try:
        path = build_report(run_dir, out)
    except FileNotFoundError as e:
        fail(str(e))
    typer.echo(str(path))
