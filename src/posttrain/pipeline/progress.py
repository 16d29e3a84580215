"""The live view of a training round: a progress bar and live reward, turns and tool calls per
domain (rich).

Rewards are exponential moving averages over the groups each domain has delivered, so a glance
shows which domains are learning, which are saturated and which never get a reward. When stdout is
not a terminal (CI, a log file) it prints one plain line every few steps instead.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table


class EvalLog:
    """An evaluation's progress where no spinner shows (a log file, CI): a line at each tenth of its
    samples, `every_s` apart at least, so a short evaluation says nothing beyond its total. Pass
    it as `run_eval(on_progress=...)`."""

    def __init__(self, console: Console, name: str, every_s: float = 10.0,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.console, self.name, self.every_s, self.clock = console, name, every_s, clock
        self.started = self.said = clock()

    def __call__(self, finished: int, total: int) -> None:
        now = self.clock()
        if finished % max(1, total // 10) == 0 and finished < total and now - self.said >= self.every_s:
            self.said = now
            self.console.print(f"{self.name}: {finished}/{total} samples, {now - self.started:.0f}s",
                               highlight=False)


class RoundProgress:
    def __init__(self, console: Console, title: str, steps: int, domains: Sequence[str],
                 start_step: int = 0, alpha: float = 0.2) -> None:
        self.console, self.steps, self.alpha = console, steps, alpha
        self.reward: dict[str, float | None] = {d: None for d in domains}
        self.groups: dict[str, int] = {d: 0 for d in domains}
        self.turns: dict[str, float | None] = {d: None for d in domains}
        self.tool_calls: dict[str, float | None] = {d: None for d in domains}
        self.last: dict[str, Any] = {}
        self.step = start_step
        self.started = time.monotonic()
        self.progress = Progress(TextColumn(f"[bold]{title}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("reward {task.fields[reward]}"), TimeElapsedColumn(),
                                 console=console)
        self.task_id = self.progress.add_task(title, total=steps, completed=start_step, reward="-")
        self.live: Live | None = None

    def __enter__(self) -> RoundProgress:
        if self.console.is_terminal:
            self.live = Live(self._render(), console=self.console, refresh_per_second=4, transient=False)
            self.live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.live is not None:
            self.live.update(self._render())
            self.live.__exit__(*exc)

    def update(self, step: int, metrics: Mapping[str, Any], domain_rewards: Mapping[str, list[float]],
               domain_acts: Mapping[str, list[tuple[int, int]]] | None = None) -> None:
        """`domain_acts`: per domain, (turns, tool calls) of each episode this step (EMA'd too)."""
        self.step, self.last = step, dict(metrics)
        for d, acts in (domain_acts or {}).items():
            for key, table in ((0, self.turns), (1, self.tool_calls)):
                if acts:
                    mean = sum(a[key] for a in acts) / len(acts)
                    prev = table.get(d)
                    table[d] = mean if prev is None else (1 - self.alpha) * prev + self.alpha * mean
        for d, rewards in domain_rewards.items():
            if not rewards:
                continue
            mean = sum(rewards) / len(rewards)
            prev = self.reward.get(d)
            self.reward[d] = mean if prev is None else (1 - self.alpha) * prev + self.alpha * mean
            self.groups[d] = self.groups.get(d, 0) + 1
        self.progress.update(self.task_id, completed=step, reward=f"{metrics.get('reward_mean', 0):.3f}")
        if self.live is not None:
            self.live.update(self._render())
        elif step == 1 or step % 10 == 0 or step == self.steps:
            self.console.print(self._line(), highlight=False)

    def _line(self) -> str:
        m = self.last
        return (f"step {self.step}/{self.steps}  reward {m.get('reward_mean', 0):.3f}  "
                f"zero-var {m.get('share_zero_variance', 0):.2f}  kl {m.get('kl', 0):.4f}  "
                f"gen busy {m.get('generator_busy') or 0:.2f}  infra {m.get('infra_errors_total', 0)}  "
                f"{time.monotonic() - self.started:.0f}s")

    def _render(self) -> Group:
        table = Table(title="live reward per domain (EMA)", show_edge=False, padding=(0, 1))
        table.add_column("domain")
        table.add_column("reward", justify="right")
        table.add_column("", min_width=20)
        table.add_column("groups", justify="right")
        table.add_column("turns", justify="right")
        table.add_column("tool calls", justify="right")
        for d, r in sorted(self.reward.items()):
            bar = "" if r is None else "█" * int(round(r * 20))
            turns, calls = self.turns.get(d), self.tool_calls.get(d)
            table.add_row(d, "-" if r is None else f"{r:.2f}", f"[green]{bar}", str(self.groups.get(d, 0)),
                          "-" if turns is None else f"{turns:.1f}", "-" if calls is None else f"{calls:.1f}")
        return Group(self.progress, table, self._line())
