"""The report's matplotlib figures, each returned as a base64 PNG data URI (self-contained HTML).

Every function takes plain data (parsed files), draws on the Agg backend (no display needed) and
closes its figure. Long domain lists are cut to `MAX_ROWS` rows (the most changed first) and the
cut is said in the figure's title, never silently.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Sequence
from typing import Any

MAX_ROWS = 60
"""bars / forest rows per figure"""


def _plt():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def to_data_uri(fig: Any) -> str:
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=90)
    _plt().close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _smooth(ys: Sequence[float], window: int) -> list[float]:
    """Trailing moving average (the first points average what there is so far)."""
    out, acc = [], 0.0
    for i, y in enumerate(ys):
        acc += y
        if i >= window:
            acc -= ys[i - window]
        out.append(acc / min(i + 1, window))
    return out


def _window(n: int) -> int:
    return max(1, n // 25)


def _line(ax: Any, points: Sequence[tuple[int, float]], label: str) -> None:
    """Raw values faint, their moving average solid: a noisy per-step mean stays readable."""
    xs, ys = zip(*sorted(points))
    w = _window(len(xs))
    if w == 1:
        ax.plot(xs, ys, marker="." if len(xs) < 40 else None, label=label)
        return
    (raw,) = ax.plot(xs, ys, alpha=0.25, lw=0.8)
    ax.plot(xs, _smooth(ys, w), color=raw.get_color(), label=label)


def learning_curves(steps_by_metric: dict[str, dict[str, list[tuple[int, float]]]], group: str = "family") -> str:
    """{metric: {group: [(step, value), ...]}} -> one panel per metric, one line per family (or
    tier); past 50 steps, a moving average over 1/25 of the steps over the faint raw values."""
    plt = _plt()
    metrics = list(steps_by_metric)
    fig, axes = plt.subplots(1, len(metrics), figsize=(5.5 * len(metrics), 3.6), squeeze=False)
    for ax, metric in zip(axes[0], metrics):
        n = 0
        for name, points in sorted(steps_by_metric[metric].items()):
            _line(ax, points, name)
            n = max(n, len(points))
        ax.set_xlabel("step")
        ax.set_ylabel(metric)
        smooth = f", mean of {_window(n)} steps" if _window(n) > 1 else ""
        ax.set_title(f"{metric} per {group}{smooth}", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, ncol=2 if len(steps_by_metric[metric]) > 6 else 1)
    return to_data_uri(fig)


def trainer_curves(series: dict[str, list[tuple[int, float]]]) -> str:
    """{metric: [(step, value)]} (loss, KL, gradient norm, entropy, ...) -> a grid of panels,
    two per row."""
    plt = _plt()
    names = list(series)
    rows = (len(names) + 1) // 2
    fig, axes = plt.subplots(rows, 2, figsize=(10, 3.0 * rows), squeeze=False)
    for ax, name in zip(axes.flat, names):
        _line(ax, series[name], name)
        n = len(series[name])
        ax.set_title(name + (f" (mean of {_window(n)} steps)" if _window(n) > 1 else ""), fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(names):]:
        ax.set_visible(False)
    return to_data_uri(fig)


def shares_vs_quotas(families: dict[str, list[tuple[int, float, float]]],
                     deviation: Sequence[tuple[int, float, float]], share: str) -> str:
    """{family: [(step, share, quota)]} and [(step, mean |share - quota|, max)] over the domains
    -> two panels: each family's share (solid) against its quota (dashed), and the deviation."""
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    for fam, points in sorted(families.items()):
        xs, shares, quotas = zip(*sorted(points))
        (line,) = axes[0].plot(xs, shares, marker="." if len(xs) < 40 else None, label=fam)
        axes[0].plot(xs, quotas, ls="--", lw=0.9, color=line.get_color())
    axes[0].set_title(f"{share} share per family (solid) against its quota (dashed)", fontsize=10)
    axes[0].set_ylabel("share of the tier")
    axes[0].legend(fontsize=7, ncol=2 if len(families) > 6 else 1)
    if deviation:
        xs, means, maxes = zip(*sorted(deviation))
        axes[1].plot(xs, means, marker=".", label="mean over domains")
        axes[1].plot(xs, maxes, marker=".", label="worst domain")
        axes[1].legend(fontsize=8)
    axes[1].set_title("|share - quota| per domain", fontsize=10)
    for ax in axes:
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    return to_data_uri(fig)


def _cut(rows: list[Any], key) -> tuple[list[Any], str]:
    if len(rows) <= MAX_ROWS:
        return rows, ""
    kept = sorted(rows, key=key, reverse=True)[:MAX_ROWS]
    return kept, f" ({MAX_ROWS} of {len(rows)} domains: the largest changes)"


def pass1_by_domain(series: Sequence[tuple[str, dict[str, tuple[float, float, float]]]],
                    what: str = "domain") -> str:
    """[(eval name, {domain (or family): (pass1, lo, hi)})] -> grouped horizontal bars with CI
    whiskers."""
    plt = _plt()
    domains = sorted({d for _, vals in series for d in vals})
    first, last = series[0][1], series[-1][1]

    def change(d: str) -> float:
        return abs(last.get(d, (0, 0, 0))[0] - first.get(d, (0, 0, 0))[0])
    domains, note = _cut(domains, change)
    domains = sorted(domains)
    height = max(2.5, 0.22 * len(domains) * max(1, len(series)) ** 0.5 + 1)
    fig, ax = plt.subplots(figsize=(7.5, height))
    width = 0.8 / len(series)
    for i, (name, vals) in enumerate(series):
        ys = [j + i * width for j in range(len(domains))]
        xs = [vals.get(d, (float("nan"),) * 3)[0] for d in domains]
        err = [[max(0.0, x - vals[d][1]) if d in vals else 0 for d, x in zip(domains, xs)],
               [max(0.0, vals[d][2] - x) if d in vals else 0 for d, x in zip(domains, xs)]]
        ax.barh(ys, xs, height=width, xerr=err, label=name, alpha=0.85, error_kw={"lw": 0.7})
    ax.set_yticks([j + 0.4 - width / 2 for j in range(len(domains))], domains, fontsize=7)
    ax.set_xlim(0, 1)
    ax.set_xlabel("pass@1 (95% CI)")
    ax.set_title(f"pass@1 per {what}" + note, fontsize=10)
    ax.invert_yaxis()
    ax.legend(fontsize=8, loc="lower right")
    return to_data_uri(fig)


def cost_vs_pass(points: Sequence[tuple[str, str, float, float, float]]) -> str:
    """[(domain, family, tokens/episode, seconds/episode, pass1)] -> two scatter panels."""
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    families = sorted({p[1] for p in points})
    for fam in families:
        sel = [p for p in points if p[1] == fam]
        axes[0].scatter([p[2] for p in sel], [p[4] for p in sel], label=fam, s=18)
        axes[1].scatter([p[3] for p in sel], [p[4] for p in sel], label=fam, s=18)
    axes[0].set_xlabel("tokens per episode (prompt + output)")
    axes[1].set_xlabel("seconds per episode (generation + sandbox)")
    axes[1].ticklabel_format(axis="x", style="sci", scilimits=(-2, 3))  # scripted runs take microseconds
    for ax in axes:
        ax.xaxis.set_major_locator(_plt().MaxNLocator(5))
        ax.set_ylabel("pass@1")
        ax.set_ylim(-0.03, 1.03)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle("cost against pass rate (one point per domain)", fontsize=10)
    return to_data_uri(fig)


def forest(rows: Sequence[tuple[str, float, float, float, bool]], title: str, *, overall: bool = True) -> str:
    """[(label, diff, lo, hi, flagged)] -> forest plot; with `overall`, the last row is the overall
    estimate (drawn last, as a diamond). Without it, the rows are drawn as given (already ranked)."""
    plt = _plt()
    if overall:
        body, last = list(rows[:-1]), [rows[-1]]
        body, note = _cut(body, lambda r: abs(r[1]))
        body = sorted(body, key=lambda r: r[1])
    else:
        body, last, note = list(rows), [], ""
    rows = body + last
    fig, ax = plt.subplots(figsize=(7.5, max(2.5, 0.22 * len(rows) + 1)))
    for i, (_label, diff, lo, hi, flagged) in enumerate(rows):
        color = "crimson" if flagged and diff < 0 else ("seagreen" if flagged else "0.3")
        marker = "D" if overall and i == len(rows) - 1 else "o"
        ax.errorbar([diff], [i], xerr=[[diff - lo], [hi - diff]], fmt=marker, color=color, ms=4, lw=1)
    ax.axvline(0, color="0.5", lw=0.8, ls="--")
    ax.set_yticks(range(len(rows)), [r[0] for r in rows], fontsize=7)
    ax.invert_yaxis()  # the overall estimate at the bottom, as in a meta-analysis forest plot
    ax.set_xlabel("difference in pass@1 (95% CI); red: significant regression, green: significant gain")
    ax.set_title(title + note, fontsize=10)
    return to_data_uri(fig)
