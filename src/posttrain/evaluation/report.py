"""`posttrain report RUN`: one self-contained HTML file (figures embedded as base64 PNG).

What it reads from the run directory (each section says so in the page when its data is missing):

* `metrics.jsonl`, `scheduler.json`, `config.json` -- training (`report_training`): learning
  curves per family and per tier, loss/KL/gradient-norm/entropy curves, the scheduler's shares
  against its quotas over time, the quarantined, retired and budget-exhausted domains. Lines
  without an integer `step`, and unparseable lines, are skipped and counted in a visible note.
* `evals/*.json` -- eval results (`posttrain.evaluation.result`): pass@1 per family (and per
  domain, up to `SMALL` domains) of the newest evaluation and the oldest one of the same tasks
  (else the oldest: `_baseline`), the domains that moved most between them with confidence
  intervals (`movers`), the latest one's tables, cost against pass rate.
* `ab/*.json` -- A/B reports (`posttrain eval compare --run-dir`): forest plots.
* `forgetting/*.json` -- forgetting reports (`posttrain.evaluation.forgetting`).
* `noise.json`, `quarantine.json` -- verifier noise and quarantined tasks (`posttrain tasks noise`).
* `contamination.json` -- the train/eval contamination check recorded at training start.
* `store.sqlite` -- episode counts and policy-version lineage, when present.
"""

from __future__ import annotations

import html
import json
import time
from pathlib import Path
from typing import Any

from posttrain.errors import write_text_atomic
from posttrain.evaluation import figures
from posttrain.evaluation.ab import AB_DIR, ABReport
from posttrain.evaluation.contamination import CONTAMINATION_FILE
from posttrain.evaluation.forgetting import FORGETTING_DIR, domain_deltas
from posttrain.evaluation.movers import rank_moves
from posttrain.evaluation.noise import NOISE_FILE, QUARANTINE_FILE
from posttrain.evaluation.report_training import sections
from posttrain.evaluation.result import EVALS_DIR, EvalResult

SMALL = figures.MAX_ROWS
"""up to this many domains, pass@1 is also drawn per domain; past it, per family only"""
MOVERS = 20
"""gains and drops drawn in the "domains that moved most" charts (each)"""


def _json_files(folder: Path) -> list[tuple[Path, Any]]:
    out = []
    for p in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            out.append((p, json.loads(p.read_text())))
        except (OSError, json.JSONDecodeError) as e:
            out.append((p, e))
    return out


def _evals(run: Path) -> tuple[dict[str, Any], list[str]]:
    folder = run / EVALS_DIR
    results, problems = [], []
    for p in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            results.append(EvalResult.load(p))
        except ValueError as e:
            problems.append(str(e))
    results.sort(key=lambda r: (r.created_at, r.name))
    if not results:
        return {"note": f"no eval results in {EVALS_DIR}/ (run `posttrain eval --run-dir {run}`)"}, problems
    latest = results[-1]
    first = _baseline(results)
    series = [(r.name, {d: (v["pass@1"]["value"], *v["pass@1"]["ci"]) for d, v in r.summary["domains"].items()
                        if v["pass@1"]["value"] is not None}) for r in results]
    shown = [series[results.index(first)], series[-1]] if len(series) > 2 else series
    fams = [(r.name, {f: (v["micro_pass1"], *v["micro_pass1_ci"]) for f, v in r.summary["families"].items()
                      if v.get("micro_pass1") is not None and v.get("micro_pass1_ci")})
            for r in ([first, latest] if len(results) > 1 else results)]
    n_domains = len({d for _, vals in shown for d in vals})
    doms = latest.summary["domains"]
    points = [(d, v["family"], v["cost"]["per_episode"]["prompt_tokens"] + v["cost"]["per_episode"]["output_tokens"],
               v["cost"]["per_episode"]["gen_s"] + v["cost"]["per_episode"]["sandbox_s"], v["pass@1"]["value"])
              for d, v in doms.items() if v["pass@1"]["value"] is not None]
    return {"results": [{"name": r.name, "policy": r.policy, "created": time.strftime(
                "%Y-%m-%d %H:%M", time.localtime(r.created_at)), "tasks": r.summary["tasks"],
                "episodes": r.summary["episodes"], "macro": r.summary["macro_pass1"],
                "micro": r.summary["micro_pass1"], "infra": r.summary["infra_error_rate"],
                "k": r.config.k, "wall_s": r.wall_s, "reused": r.reused} for r in results],
            "pass_figure": (figures.pass1_by_domain(shown) if any(s[1] for s in shown) and n_domains <= SMALL
                            else None),
            "n_domains": n_domains,
            "family_figure": figures.pass1_by_domain(fams, what="family (micro, all tasks)")
            if any(f[1] for f in fams) else None,
            "moves": _moves(first, latest) if len(results) > 1 else None,
            "cost_figure": figures.cost_vs_pass(points) if points else None,
            "latest": latest.name, "families": latest.summary["families"], "domains": doms,
            "k": latest.config.k}, problems


def _baseline(results: list[EvalResult]) -> EvalResult:
    """What the newest evaluation is compared with: the oldest one of the same tasks, else the
    oldest. A run's directory can hold evaluations of other task sets beside its before/after
    pair (a benchmark's evaluations of more tasks, made later): compared with `before`, the newest
    would be paired on the few tasks the two share, under a title naming the whole of both."""
    def tasks(r: EvalResult) -> frozenset[str]:
        return frozenset(t.hash for t in r.records)

    want = tasks(results[-1])
    return next((r for r in results[:-1] if tasks(r) == want), results[0])


def _moves(first: EvalResult, last: EvalResult) -> dict[str, Any]:
    """The domains that moved most from the first evaluation to the last, ranked by how large the
    change is at least (`movers`), drawn with their intervals; the full list goes in a table."""
    moves = rank_moves(domain_deltas(first, last))

    def rows(items: list[dict[str, Any]]) -> list[tuple[str, float, float, float, bool]]:
        return [(r["domain"], r["delta"], r["ci"][0], r["ci"][1], r["significant"]) for r in items[:MOVERS]]

    n = len(moves.gains) + len(moves.drops)
    return {"gains": moves.gains, "drops": moves.drops, "unmoved": moves.unmoved, "moved": n,
            "significant": moves.significant, "first": first.name, "last": last.name,
            "gain_figure": figures.forest(rows(moves.gains), f"largest gains, {last.name} minus {first.name} "
                                          f"({min(MOVERS, len(moves.gains))} of {len(moves.gains)})",
                                          overall=False) if moves.gains else None,
            "drop_figure": figures.forest(rows(moves.drops), f"largest drops, {last.name} minus {first.name} "
                                          f"({min(MOVERS, len(moves.drops))} of {len(moves.drops)})",
                                          overall=False) if moves.drops else None}


def _ab(run: Path) -> tuple[list[dict[str, Any]], list[str]]:
    out, problems = [], []
    for p, data in _json_files(run / AB_DIR):
        try:
            if isinstance(data, Exception):
                raise ValueError(f"{p}: {data}")
            rep = ABReport.from_dict(data, where=str(p))
        except (ValueError, KeyError) as e:
            problems.append(str(e))
            continue
        rows = [(d, v["diff"], v["ci"][0], v["ci"][1], v["significant"]) for d, v in rep.domains.items()]
        o = rep.overall
        rows.append(("overall (macro)", o["diff"], o["ci"][0], o["ci"][1], o["significant"]))
        out.append({"title": f"{rep.b} vs {rep.a}", "figure": figures.forest(rows, f"A/B: {rep.b} minus {rep.a}"),
                    "overall": o, "regressions": rep.regressions, "warnings": rep.warnings})
    return out, problems


def _forgetting(run: Path) -> tuple[list[dict[str, Any]], list[str]]:
    out, problems = [], []
    for p, data in _json_files(run / FORGETTING_DIR):
        if isinstance(data, Exception) or not isinstance(data, dict) or "held_out" not in data:
            problems.append(f"{p}: not a forgetting report")
            continue
        rows = [(d, r["delta"], r["ci"][0], r["ci"][1], r["significant_drop"]) for d, r in data["held_out"].items()]
        fig = None
        if rows:
            mean = data.get("held_out_mean_delta") or 0.0
            rows.append(("held-out mean", mean, mean, mean, bool(data.get("forgotten"))))
            fig = figures.forest(rows, f"forgetting: held-out domains, {data['after']} minus {data['before']}")
        out.append({"name": p.stem, "figure": fig, "data": data})
    return out, problems


def _read(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _store(run: Path) -> dict[str, Any] | None:
    if not (run / "store.sqlite").is_file():
        return None
    from posttrain.storage.store import Store, StoreError

    try:
        with Store.for_run_dir(run, readonly=True) as store:
            from posttrain.evaluation.image_episodes import image_episodes

            return {"counts": store.counts(), "versions": store.policy_versions(),
                    "image_episodes": image_episodes(store)}
    except StoreError as e:
        return {"error": str(e)}


def build_report(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Write the HTML report of `run_dir` (default `RUN/report.html`) and return its path."""
    from jinja2 import Environment, PackageLoader, select_autoescape

    run = Path(run_dir)
    if not run.is_dir():
        raise FileNotFoundError(f"{run}: no such run directory")
    evals, eval_problems = _evals(run)
    ab, ab_problems = _ab(run)
    forgetting, f_problems = _forgetting(run)
    quarantine = _read(run / QUARANTINE_FILE)
    env = Environment(loader=PackageLoader("posttrain.evaluation", "templates"),
                      autoescape=select_autoescape(["html", "j2"]))
    env.filters["pct"] = lambda x: "–" if x is None else f"{100 * x:.1f}%"
    env.filters["num"] = lambda x, nd=3: "–" if x is None else f"{x:.{nd}f}"
    page = env.get_template("report.html.j2").render(
        run=str(run.resolve()), generated=time.strftime("%Y-%m-%d %H:%M:%S"), store=_store(run),
        **sections(run), evals=evals, ab=ab, forgetting=forgetting,
        noise=_read(run / NOISE_FILE),
        quarantine=(quarantine or {}).get("tasks") if isinstance(quarantine, dict) else None,
        contamination=_read(run / CONTAMINATION_FILE),
        problems=eval_problems + ab_problems + f_problems, escape=html.escape)
    path = Path(out) if out else run / "report.html"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, page, "writing the report")
    return path
