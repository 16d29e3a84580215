"""The registry of task families and their domains.

A family is a callable returning the domains it registers (usually many, from parameters).
Built-in families are the modules named in `BUILTIN_FAMILY_MODULES`, each exposing
`domains() -> Iterable[Domain]`. Third-party families are Python entry points in the group
`posttrain.families`, each pointing at such a callable:

    [project.entry-points."posttrain.families"]
    mytasks = "my_package.tasks:domains"

Families load lazily, once per process, on the first look-up.
"""

from __future__ import annotations

import fnmatch
import importlib
from importlib.metadata import entry_points
from typing import Callable, Iterable

from posttrain.tasks.domain import Domain

ENTRY_POINT_GROUP = "posttrain.families"

BUILTIN_FAMILY_MODULES: tuple[str, ...] = (
    "posttrain.tasks.families.math",
    "posttrain.tasks.families.text",
    "posttrain.tasks.families.documents",
    "posttrain.tasks.families.code",
    "posttrain.tasks.families.terminal",
    "posttrain.tasks.families.geometry",
    "posttrain.tasks.families.reasoning_gym",
)


class RegistryError(ValueError):
    """A family that cannot load, a duplicate domain name, or an unknown domain."""


_domains: dict[str, Domain] | None = None
_sources: dict[str, str] = {}


def _add(found: Iterable[Domain], source: str, into: dict[str, Domain]) -> None:
    for domain in found:
        if not isinstance(domain, Domain):
            raise RegistryError(f"family {source} returned {type(domain).__name__}, not a Domain")
        if domain.name in into:
            raise RegistryError(f"domain {domain.name!r} is registered twice "
                                f"(by {_sources[domain.name]} and by {source})")
        into[domain.name] = domain
        _sources[domain.name] = source


def _load() -> dict[str, Domain]:
    found: dict[str, Domain] = {}
    for module_name in BUILTIN_FAMILY_MODULES:
        module = importlib.import_module(module_name)
        _add(module.domains(), module_name, found)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            factory: Callable[[], Iterable[Domain]] = ep.load()
            produced = list(factory())
        except Exception as e:  # a broken plugin must name itself
            raise RegistryError(f"task family plugin {ep.name!r} ({ep.value}) failed to load: "
                                f"{type(e).__name__}: {e}") from e
        _add(produced, f"plugin {ep.name} ({ep.value})", found)
    return found


def all_domains() -> dict[str, Domain]:
    """Every registered domain, by name (sorted)."""
    global _domains
    if _domains is None:
        _domains = dict(sorted(_load().items()))
    return _domains


def get_domain(name: str) -> Domain:
    domains = all_domains()
    try:
        return domains[name]
    except KeyError:
        close = [n for n in domains if n.startswith(name.split(".")[0] + ".")][:5]
        hint = f"; domains of that family include {', '.join(close)}" if close else ""
        raise RegistryError(f"unknown domain {name!r}{hint} (see `posttrain tasks list`)") from None


def match_domains(patterns: str | Iterable[str]) -> list[Domain]:
    """Domains whose names match any glob pattern (comma-separated string or a list)."""
    if isinstance(patterns, str):
        patterns = [p.strip() for p in patterns.split(",") if p.strip()]
    patterns = list(patterns)
    matched = [d for n, d in all_domains().items() if any(fnmatch.fnmatchcase(n, p) for p in patterns)]
    if not matched:
        raise RegistryError(f"no domain matches {', '.join(patterns)!r} (see `posttrain tasks list`)")
    return matched


def families() -> dict[str, list[Domain]]:
    out: dict[str, list[Domain]] = {}
    for d in all_domains().values():
        out.setdefault(d.family, []).append(d)
    return out


def reset_cache() -> None:
    """Forget loaded families (tests that install a plugin call this)."""
    global _domains
    _domains = None
    _sources.clear()
