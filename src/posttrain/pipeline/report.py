"""The job's summary (`summary.json`) and its closing table: pass@1 per domain before and after."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table


def pass_of(result: Any, domain: str, key: str) -> float | None:
    entry = result.summary["domains"].get(domain, {}).get(key)
    return None if entry is None else entry.get("value")


def summarize(run: str, steps: int, k: int, before: Any, after: Any, trained: Sequence[str],
              heldout: Sequence[str], train_s: float, total_s: float, stopped_early: str | None) -> dict:
    def mean(result: Any, names: Sequence[str], key: str) -> float | None:
        vals = [v for n in names if (v := pass_of(result, n, key)) is not None]
        return sum(vals) / len(vals) if vals else None

    out = {"run": run, "steps": steps,
           "base_pass1": mean(before, trained, "pass@1"), f"base_pass{k}": mean(before, trained, f"pass@{k}"),
           "final_pass1": mean(after, trained, "pass@1"), f"final_pass{k}": mean(after, trained, f"pass@{k}"),
           "heldout_base_pass1": mean(before, heldout, "pass@1"),
           "heldout_final_pass1": mean(after, heldout, "pass@1"),
           "train_s": round(train_s, 1), "total_s": round(total_s, 1), "stopped_early": stopped_early}
    base, final = out["heldout_base_pass1"], out["heldout_final_pass1"]
    if isinstance(base, float) and isinstance(final, float):
        out["untrained_delta"] = final - base
    return out


def untrustworthy_reasons(before: Any, after: Any, max_infra_rate: float, *, steps: int, steps_done: int,
                          stopped_early: str | None) -> list[str]:
    """Why the run's result is not what was asked (one line each; [] when it is): training
    stopped before its last step, or an evaluation has too many infrastructure errors."""
    from posttrain.evaluation.trust import untrustworthy

    reasons = []
    if steps_done < steps or stopped_early:
        reasons.append(f"training stopped at step {steps_done} of {steps}: {stopped_early or 'stopped early'}")
    for name, result in (("before", before), ("after", after)):
        reasons += untrustworthy(result.summary, max_infra_rate, label=f"evals/{name}")
    return reasons


def print_table(console: Console, steps: int, k: int, before: Any, after: Any, trained: Sequence[str],
                summary: dict) -> None:
    table = Table(title=f"held-out pass@1 per domain (eval split), before -> after {steps} steps")
    for col in ("domain", "trained", "before pass@1", f"before pass@{k}", "after pass@1", "delta"):
        if col == "domain":  # never cut a domain name, whatever the terminal's width
            table.add_column(col, no_wrap=True, min_width=max(map(len, before.summary["domains"]), default=6))
        else:
            table.add_column(col, justify="right")
    for name in sorted(set(before.summary["domains"]) | set(after.summary["domains"]),
                       key=lambda n: (n not in trained, n)):
        p0, pk, p1 = pass_of(before, name, "pass@1"), pass_of(before, name, f"pass@{k}"), pass_of(after, name, "pass@1")
        delta = "" if p0 is None or p1 is None else f"{p1 - p0:+.3f}"
        table.add_row(name, "yes" if name in trained else "held out",
                      *("-" if v is None else f"{v:.3f}" for v in (p0, pk, p1)), delta)
    console.print(table)
    fmt = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
    console.print(
        f"trained domains: pass@1 {fmt(summary['base_pass1'])} -> {fmt(summary['final_pass1'])} "
        f"(base pass@{k} {fmt(summary[f'base_pass{k}'])}); held out: "
        f"{fmt(summary['heldout_base_pass1'])} -> {fmt(summary['heldout_final_pass1'])}; "
        f"training {summary['train_s']}s, total {summary['total_s']}s")
