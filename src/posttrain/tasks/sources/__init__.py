"""Task sources given at run time: data files and datasets as domains, with no code.

    posttrain tasks check --source data:qa.jsonl
    posttrain eval --source data:qa.jsonl --tasks 'data.qa'
    [domains] sources = ["data:qa.jsonl"]        # in a run config

`use_sources(specs)` reads each source and registers its domains with the task registry, so every
command that names domains (globs, `tasks check`, the scheduler, evaluation, replay) finds them
like built-in ones. Kinds of source:

* `data:PATH[?QUERY]`: a JSONL/JSON/Parquet file or a `datasets` save_to_disk folder, described
  by a small TOML beside it or the query (`posttrain.tasks.sources.spec`, `posttrain.tasks.sources.data`).
* `harbor:DIR[?network=1]`: a Harbor / Terminal-Bench task folder, or a folder of them
  (`posttrain.tasks.families.terminal.harbor_source`); a folder that does not load is reported
  by name and skipped (asking for its domain by name says why). `network=1`: the tasks' images
  are built with the host's network (RUN steps that fetch packages); episodes never have it.
* `verifiers:NAME[?ARG=VALUE&...]`: an installed `verifiers` environment package, loaded with
  `verifiers.load_environment(NAME, **args)` (`posttrain.tasks.sources.verifiers_env`: which kinds
  are supported, where its rubric and tools run).

A source that cannot be read is a `SourceError` (a `UserError`: one line, exit 2) naming the
file, the row and the column.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from urllib.parse import parse_qsl

from posttrain.errors import UserError
from posttrain.tasks.domain import Domain

KINDS = ("data", "harbor", "verifiers")


class SourceError(UserError):
    """A task source that cannot be used; the message names the file, row and column."""


_loaded: dict[tuple[str, str], list[Domain]] = {}
"""(spec, working directory) -> its domains: a source named twice in one process is read once"""


def load_source(spec: str, base: Path | None = None) -> list[Domain]:
    """The domains of one source (not registered)."""
    from posttrain.tasks.sources.data import DataSourceError, data_domain
    from posttrain.tasks.sources.rows import RowsError
    from posttrain.tasks.sources.spec import SpecError, parse_data_source

    kind, sep, rest = spec.partition(":")
    if not sep or kind not in KINDS:
        raise SourceError(f"unknown task source {spec!r}: expected {' or '.join(k + ':...' for k in KINDS)} "
                          "(e.g. data:qa.jsonl)")
    key = (spec, str(base or Path.cwd()))
    if kind == "harbor" and key not in _loaded:
        _loaded[key] = _harbor(rest, base)
    if kind == "verifiers" and key not in _loaded:
        _loaded[key] = [_verifiers(rest)]
    if key not in _loaded:
        try:
            parsed, data, where = parse_data_source(rest, base)
            _loaded[key] = [data_domain(parsed, data, where)]
        except (SpecError, DataSourceError, RowsError) as e:
            raise SourceError(str(e)) from None
        except ValueError as e:  # a verifier parameter (named.py names it)
            raise SourceError(str(e)) from None
    return _loaded[key]


def _harbor(rest: str, base: Path | None) -> list[Domain]:
    from posttrain.tasks.families.terminal.harbor_source import HarborSourceError, harbor_domains
    from posttrain.tasks.registry import BrokenDomain, add_broken

    rest, _, query = rest.partition("?")
    network = False
    for key, value in parse_qsl(query, keep_blank_values=True):
        if key != "network" or value not in ("0", "1", "true", "false"):
            raise SourceError(f"harbor:{rest}?{query}: unknown option {key}={value!r} (the one "
                              "option is network=1: build the images with the host's network)")
        network = value in ("1", "true")
    path = Path(rest).expanduser()
    if not path.is_absolute():
        path = (base or Path.cwd()) / path
    try:
        found = harbor_domains(path, build_network=network)
    except HarborSourceError as e:
        raise SourceError(str(e)) from None
    add_broken(d for d in found if isinstance(d, BrokenDomain))
    return [d for d in found if isinstance(d, Domain)]


def _verifiers(rest: str) -> Domain:
    from posttrain.tasks.sources.spec import _value
    from posttrain.tasks.sources.verifiers_env import VerifiersSourceError, verifiers_domain

    name, _, query = rest.partition("?")
    if not name.strip():
        raise SourceError("verifiers:NAME: give the environment's name (e.g. verifiers:my-env)")
    args = {k: _value(v) for k, v in parse_qsl(query, keep_blank_values=True)}
    try:
        return verifiers_domain(name.strip(), args)
    except VerifiersSourceError as e:
        raise SourceError(str(e)) from None


def absolute(spec: str, base: Path | None = None) -> str:
    """`spec` with its path made absolute (data: and harbor:), as a run records it: a later
    process (`posttrain replay`, a Ray worker) reads the same files from any directory."""
    kind, sep, rest = spec.partition(":")
    if not sep or kind not in ("data", "harbor"):
        return spec
    path, q, query = rest.partition("?")
    full = Path(path).expanduser()
    if not full.is_absolute():
        full = (base or Path.cwd()) / full
    return f"{kind}:{full.resolve()}{q}{query}"


def recorded_sources(run_configs: Iterable[dict]) -> list[str]:
    """The task sources the runs of a store were made with, in order, once each: `sources` in a
    rollout's or an evaluation's config, `domains.sources` in a training run's."""
    out: list[str] = []
    for config in run_configs:
        domains = config.get("domains")  # a training run's section; a rollout's patterns (a string)
        specs = config.get("sources") or (domains.get("sources") if isinstance(domains, dict) else None) or []
        out += [s for s in specs if isinstance(s, str) and s not in out]
    return out


def use_sources(specs: Iterable[str] | None, base: Path | None = None) -> list[Domain]:
    """Read every source and register its domains; returns them. Relative paths resolve
    against `base` (default: the current directory)."""
    from posttrain.tasks.registry import RegistryError, add_domains

    out: list[Domain] = []
    for spec in specs or ():
        domains = load_source(spec, base)
        try:
            add_domains(domains, f"source {spec}")
        except RegistryError as e:
            raise SourceError(str(e)) from None
        out += domains
    return out
