"""Checks for command-line numbers that typer's own ranges cannot make.

click's `FloatRange(min=0, max=1)` compares the value with its bounds, and every comparison with
nan is false, so `--max-infra-rate nan` passed the range and then switched the gate off (no rate
is above nan). A share or a significance level is checked here, as a callback, instead.
"""

from __future__ import annotations

import math

import typer


def share(value: float) -> float:
    """A fraction from 0 to 1 inclusive (an error rate, a flip rate, a similarity threshold)."""
    if not math.isfinite(value) or not 0.0 <= value <= 1.0:
        raise typer.BadParameter(f"must be a number from 0 to 1, got {value}")
    return value


def significance(value: float) -> float:
    """A significance level: strictly between 0 and 1."""
    if not math.isfinite(value) or not 0.0 < value < 1.0:
        raise typer.BadParameter(f"must be a number strictly between 0 and 1, got {value}")
    return value


def non_negative(value: float) -> float:
    """A finite number 0 or above (a sampling temperature)."""
    if not math.isfinite(value) or value < 0.0:
        raise typer.BadParameter(f"must be a finite number 0 or above, got {value}")
    return value
