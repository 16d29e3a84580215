"""An evaluation's progress in a log file: a line a tenth of its samples, never more often than
`every_s`, nothing for a short evaluation."""

import io

from rich.console import Console

from posttrain.pipeline.progress import EvalLog


def lines_of(finished_at: list[tuple[int, float]], total: int) -> list[str]:
    out = io.StringIO()
    now = [0.0]
    log = EvalLog(Console(file=out, width=200), "before", every_s=10.0, clock=lambda: now[0])
    for finished, t in finished_at:
        now[0] = t
        log(finished, total)
    return out.getvalue().splitlines()


def test_a_long_evaluation_says_each_tenth():
    assert lines_of([(i, i * 1.0) for i in range(1, 101)], 100) == [
        f"before: {i}/100 samples, {i}s" for i in range(10, 100, 10)]  # the total is said by the run


def test_tenths_closer_than_every_s_are_skipped_and_a_short_evaluation_says_nothing():
    assert lines_of([(i, i * 0.4) for i in range(1, 101)], 100) == [
        "before: 30/100 samples, 12s", "before: 60/100 samples, 24s", "before: 90/100 samples, 36s"]
    assert lines_of([(i, i * 0.01) for i in range(1, 11)], 10) == []
