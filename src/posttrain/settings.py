"""One way to declare settings: a frozen pydantic dataclass with a docstring under every field.

    @settings
    class TrainerConfig:
        lr: float = 1e-4
        \"\"\"AdamW learning rate (constant)\"\"\"

        @model_validator(mode="after")
        def _rules(self) -> "TrainerConfig":
            check(self.lr > 0, self, "lr", "must be > 0")
            return self

Pydantic checks types (a string where a number belongs is an error, not a crash later) and
rejects unknown fields; `check` states the value rules and names the field, so a run config's
error reads ``my.toml: trainer.lr: must be > 0 (got -1.0)`` and a direct construction raises
``TrainerConfig.lr must be > 0, got -1.0``. The field docstrings become the fields' descriptions
(`describe_fields`). The classes stay dataclasses: positional construction, `dataclasses.replace`
(which validates again) and `dataclasses.asdict` work as before.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar, dataclass_transform

from pydantic import ConfigDict, Field, TypeAdapter, ValidationError
from pydantic.dataclasses import dataclass as _pydantic_dataclass

T = TypeVar("T")

# `allow_inf_nan=False`: no setting means anything at inf or nan (a limit that can be absent is
# None), and an `lr = inf` would otherwise train nan weights and record `Infinity` in config.json
SETTINGS = ConfigDict(extra="forbid", use_attribute_docstrings=True, allow_inf_nan=False)


@dataclass_transform(frozen_default=True, field_specifiers=(dataclasses.field, Field))
def settings(cls: type[T]) -> type[T]:
    """Make `cls` a frozen, validated settings dataclass (unknown fields are errors)."""
    return _pydantic_dataclass(frozen=True, config=SETTINGS)(cls)  # type: ignore[return-value]


class SettingError(ValueError):
    """A value rule a setting broke; `field` is the field's name within its class."""

    def __init__(self, owner: str, field: str, rule: str, value: object) -> None:
        super().__init__(f"{owner}.{field} {rule}, got {value!r}")
        self.field, self.rule, self.value = field, rule, value


def check(cond: bool, owner: object, field: str, rule: str, value: object = dataclasses.MISSING) -> None:
    """Raise `SettingError` naming `owner`'s `field` unless `cond` holds. `owner` is the settings
    object (its class names the error) or a label; `value` defaults to the field's value."""
    if cond:
        return
    label = owner if isinstance(owner, str) else type(owner).__name__
    if value is dataclasses.MISSING:
        value = getattr(owner, field)
    raise SettingError(label, field, rule, value)


def error_lines(e: ValidationError, prefix: Iterable[str] = ()) -> list[str]:
    """`dotted.field: message (got value)` per error of `e`, each located at the field it is about
    (a rule checked across fields names the field it blames)."""
    lines = []
    for err in e.errors():
        loc = [*prefix, *(str(p) for p in err["loc"])]
        cause = (err.get("ctx") or {}).get("error")
        if isinstance(cause, SettingError):
            lines.append(f"{'.'.join([*loc, cause.field])}: {cause.rule} (got {cause.value!r})")
            continue
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] in ("extra_forbidden", "unexpected_keyword_argument"):
            lines.append(f"{'.'.join(loc)}: unknown field (check the spelling; see the documented fields)")
            continue
        got = err.get("input")
        shown = "" if isinstance(got, (dict, Mapping)) or type(got).__name__ == "ArgsKwargs" else f" (got {got!r})"
        lines.append(f"{'.'.join(loc) or '(top level)'}: {msg}{shown}")
    return lines


def from_data(cls: type[T], data: Mapping[str, Any], where: str) -> T:
    """Build settings from plain data (a JSON/TOML table); errors start with `where` and name
    unknown fields first (a typo is the likeliest mistake)."""
    if not isinstance(data, Mapping):
        raise ValueError(f"{where}: expected a table of {cls.__name__} fields, got {data!r}")
    known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"{where}: unknown {cls.__name__} field(s) {', '.join(unknown)} "
                         f"(known: {', '.join(sorted(known))})")
    try:
        return TypeAdapter(cls).validate_python(dict(data))
    except ValidationError as e:
        causes = [(err.get("ctx") or {}).get("error") for err in e.errors()]
        if len(causes) == 1 and isinstance(causes[0], SettingError):
            raise ValueError(f"{where}: {causes[0]}") from None
        raise ValueError(f"{where}: " + "; ".join(error_lines(e))) from None


def to_data(obj: Any) -> dict[str, Any]:
    """Plain JSON-able data of a settings object (tuples become lists)."""
    return TypeAdapter(type(obj)).dump_python(obj, mode="json")


def describe_fields(cls: type) -> dict[str, str]:
    """field -> its docstring, for help texts and generated documentation."""
    fields: dict[str, Any] = getattr(cls, "__pydantic_fields__", {})
    return {name: info.description or "" for name, info in fields.items()}

