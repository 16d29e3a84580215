"""reasoning-gym imported with its modules' clocks fixed, for the `rg` family (`reasoning_gym`):
a task must be a function of its seed alone, and one generator read the date."""

from __future__ import annotations

import datetime
import types
from functools import cache
from typing import Any

FIXED_DAY = (2025, 1, 1)
"""the day a reasoning-gym module sees when it asks for today (see `fixed_clock_reasoning_gym`)"""


class _FixedDate(datetime.date):
    @classmethod
    def today(cls):
        return cls(*FIXED_DAY)


class _FixedDatetime(datetime.datetime):
    @classmethod
    def now(cls, tz=None):
        return cls(*FIXED_DAY, tzinfo=tz)

    @classmethod
    def today(cls):
        return cls(*FIXED_DAY)

    @classmethod
    def utcnow(cls):
        return cls(*FIXED_DAY)


def _fixed_dateutil_parser(parser: types.ModuleType) -> types.ModuleType:
    """`dateutil.parser` whose `parse` fills what a string leaves out from `FIXED_DAY`, not from
    today (its default)."""

    def parse(timestr: Any, parserinfo: Any = None, **kwargs: Any) -> Any:
        kwargs.setdefault("default", datetime.datetime(*FIXED_DAY))
        return parser.parse(timestr, parserinfo, **kwargs)

    shim = types.ModuleType(parser.__name__)
    shim.__dict__.update(vars(parser))
    shim.parse = parse  # type: ignore[attr-defined]
    return shim


@cache
def fixed_clock_reasoning_gym():
    """reasoning-gym, its modules' clocks fixed at `FIXED_DAY`. A generator that reads the date
    makes another task tomorrow from the same seed (`time_intervals` put today's date in its
    items' metadata, by `date.today()` and by `dateutil.parser.parse` of a bare time, so a task's
    hash changed at midnight: a run resumed the next day found its evaluation's tasks changed and
    drew it all again). Every reasoning-gym module that imported the `date` or `datetime` class
    gets one whose `today()` / `now()` is that day, and one that imported `dateutil.parser` gets
    a `parse` that fills from that day; only those modules' names change, not the classes or
    modules others use. `posttrain tasks check` regenerates tasks on another day, in another
    process, to catch what this misses."""
    import sys

    import reasoning_gym

    swap: dict[Any, Any] = {datetime.date: _FixedDate, datetime.datetime: _FixedDatetime}
    if (parser := sys.modules.get("dateutil.parser")) is not None:
        swap[parser] = _fixed_dateutil_parser(parser)
    for name, module in list(sys.modules.items()):
        if name.split(".")[0] == "reasoning_gym" and module is not None:
            for attr, value in list(vars(module).items()):
                if isinstance(value, (type, types.ModuleType)) and value in swap:
                    setattr(module, attr, swap[value])
    return reasoning_gym
