"""The registry of task families and their domains.

A family is a callable returning the domains it registers (usually many, from parameters).
Built-in families are the modules named in `BUILTIN_FAMILY_MODULES`, each exposing
`domains() -> Iterable[Domain]`. Third-party families are Python entry points in the group
`posttrain.families`, each pointing at such a callable:

    [project.entry-points."posttrain.families"]
    mytasks = "my_package.tasks:domains"

Families load lazily, once per process, on the first look-up.

A plugin that fails to load, or a task folder that does not parse (a family yields a
`BrokenDomain` for it instead of a `Domain`), is not fatal: it is reported once on stderr by name
(`broken()` lists them) and skipped, so `posttrain eval --tasks math.add.d1` works whatever state
some Harbor folder is in. Asking for a broken domain by its exact name is an error that says why.
"""

from __future__ import annotations

import fnmatch
import importlib
import importlib.util
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib.metadata import entry_points

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


@dataclass(frozen=True)
class BrokenDomain:
    """What a family yields for a task source that cannot become a domain (a malformed task
    folder): the registry reports and skips it instead of failing every command."""

    name: str
    """the domain name it would have had (e.g. 'terminal.harbor.my-task'), or the plugin's"""
    error: str
    """what is wrong, naming the file and field"""


log = logging.getLogger("posttrain.tasks")

_domains: dict[str, Domain] | None = None
_sources: dict[str, str] = {}
_broken: dict[str, BrokenDomain] = {}
_added: dict[str, tuple[Domain, str]] = {}
"""domains added at run time from a task source (`--source`, `[domains] sources`): name ->
(domain, source); they survive a reload of the families"""


def _add(found: Iterable[Domain | BrokenDomain], source: str, into: dict[str, Domain]) -> None:
    for domain in found:
        if isinstance(domain, BrokenDomain):
            _broken[domain.name] = domain
            continue
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
        except Exception as e:  # noqa: BLE001 - a broken plugin names itself and is skipped
            name = f"plugin {ep.name}"
            _broken[name] = BrokenDomain(name, f"task family plugin {ep.name!r} ({ep.value}) failed "
                                               f"to load: {type(e).__name__}: {e}")
            continue
        _add(produced, f"plugin {ep.name} ({ep.value})", found)
    for b in _broken.values():
        log.warning("posttrain: skipped %s: %s", b.name, b.error)
    return found


def all_domains() -> dict[str, Domain]:
    """Every registered domain, by name (sorted)."""
    global _domains
    if _domains is None:
        found = _load()
        for name, (domain, source) in _added.items():
            if name in found:
                raise RegistryError(f"domain {name!r} is registered twice (by {_sources[name]} and by {source})")
            found[name] = domain
        _domains = dict(sorted(found.items()))
    return _domains


def add_domains(domains: Iterable[Domain], source: str) -> None:
    """Register domains from a task source given at run time (`posttrain.tasks.sources`). Adding the
    same source again replaces its domains; a name another source or family has is an error."""
    global _domains
    current = all_domains()
    new = list(domains)
    for d in new:
        if not isinstance(d, Domain):
            raise RegistryError(f"{source} produced {type(d).__name__}, not a Domain")
        owner = _added[d.name][1] if d.name in _added else _sources.get(d.name)
        if owner is not None and owner != source:
            raise RegistryError(f"domain {d.name!r} is registered twice (by {owner} and by {source}); "
                                "give the source another name")
    for d in new:
        _added[d.name] = (d, source)
    _domains = dict(sorted({**current, **{d.name: d for d in new}}.items()))


def add_broken(items: Iterable[BrokenDomain]) -> None:
    """Record task folders of a run-time source that did not load: reported once on stderr,
    skipped, and named in the error when asked for by name (as for families)."""
    all_domains()  # the families first: their load reports its own broken ones
    for b in items:
        if b.name not in _broken:
            log.warning("posttrain: skipped %s: %s", b.name, b.error)
        _broken[b.name] = b


def broken() -> dict[str, BrokenDomain]:
    """Task sources that failed to load (reported and skipped), by name."""
    all_domains()
    return dict(_broken)


def _refuse_broken(name: str) -> None:
    if name in _broken:
        raise RegistryError(f"domain {name!r} cannot be loaded: {_broken[name].error}")


def get_domain(name: str) -> Domain:
    domains = all_domains()
    try:
        return domains[name]
    except KeyError:
        _refuse_broken(name)
        close = [n for n in domains if n.startswith(name.split(".")[0] + ".")][:5]
        hint = f"; domains of that family include {', '.join(close)}" if close else ""
        raise RegistryError(f"unknown domain {name!r}{hint} (see `posttrain tasks list`)") from None


def match_domains(patterns: str | Iterable[str]) -> list[Domain]:
    """Domains whose names match any glob pattern (comma-separated string or a list)."""
    if isinstance(patterns, str):
        patterns = [p.strip() for p in patterns.split(",") if p.strip()]
    patterns = list(patterns)
    matched = [d for n, d in all_domains().items() if any(fnmatch.fnmatchcase(n, p) for p in patterns)]
    for p in patterns:  # named exactly, not through a glob: the caller needs that very domain
        _refuse_broken(p)
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
    _broken.clear()
    _added.clear()
