"""Dockerfiles, read honestly: every instruction is honoured or refused with its file and line.

`parse(path)` returns the instructions (continuations joined, comments dropped, each with the
line it starts on); `plan(path)` turns them into an `ImagePlan`: the base, the build steps and
the image's settings. What is honoured, and how (`posttrain.images.build` runs the steps):

    FROM debian|ubuntu|python:3.X   a base derived from the host (`base.py`); once, first
    RUN [--network=default|none] cmd | RUN ["argv"]
                                    as the current USER (root by default, in a user namespace),
                                    in WORKDIR, with ENV and ARG set; without network unless the
                                    build is allowed it (`build(network=True)`), then with it
                                    unless the step says --network=none; --network=default in a
                                    build without network is an error naming the line
    COPY/ADD [--chown] [--chmod] [--link] SRC... DEST
                                    local files of the build context (the Dockerfile's folder):
                                    bytes, modes, symlinks and empty directories exactly;
                                    wildcards; `.dockerignore`
    ADD [--checksum=sha256:HEX] [--chown] [--chmod] http(s)://URL DEST
                                    fetched by the host at build time, only in a build allowed
                                    network (else an error naming the line); mode 0600 as in
                                    Docker unless --chmod; never unpacked. With --checksum the
                                    layer is keyed by URL + checksum (cached, verified when
                                    fetched); without, the URL is fetched again on every build
                                    and the layer keyed by the bytes it returned (see `build.py`)
    WORKDIR dir                     created, and the working directory of later steps/episodes
    ENV k=v ... | ENV k v           for later steps and the episode; `$VAR`/`${VAR}`/`${VAR:-x}`
    ARG name[=default]              substituted like ENV, in the environment of later RUNs only
    USER name[:group] | uid[:gid]   later RUNs and the episode run as it (looked up in the image)
    SHELL ["sh", "-c"]              the shell of later shell-form RUNs
    ENTRYPOINT / CMD                the image's service: started before the first turn
    EXPOSE, LABEL, MAINTAINER       recorded (the sandbox's own loopback has every port)

Refused, with the reason: a second FROM (multi-stage) or `COPY --from`; `ADD` of a git
repository, of several sources one of them a URL, or of a local archive (no auto-extraction);
`RUN --mount/--security`, `RUN --network=host`;
heredocs; VOLUME, HEALTHCHECK, STOPSIGNAL, ONBUILD; `# escape=`; anything else unknown.
"""

from __future__ import annotations

import json
import posixpath
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path


class DockerfileError(ValueError):
    """An instruction this builder cannot honour; the message names the file and line."""


@dataclass(frozen=True)
class Instruction:
    op: str
    rest: str
    line: int


@dataclass
class ImagePlan:
    """What a Dockerfile asks for (`build.py` turns it into layers)."""

    base: str
    base_line: int
    steps: list[dict] = field(default_factory=list)
    """{"kind": "run"|"copy"|"mkdir", "line": N, ...} in order"""
    env: dict[str, str] = field(default_factory=dict)
    user: str = ""
    user_line: int = 0
    workdir: str = "/"
    entrypoint: list[str] | None = None
    cmd: list[str] | None = None
    exposed: list[str] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)


_VAR = re.compile(r"\\\$|\$(?:\{(\w+)(?::([-+])([^}]*))?\}|(\w+))")
REFUSED = {
    "VOLUME": "VOLUME is not supported (the sandbox has no volumes; write the directory with "
              "RUN mkdir)",
    "HEALTHCHECK": "HEALTHCHECK is not supported (a service is checked by the task's tests)",
    "STOPSIGNAL": "STOPSIGNAL is not supported (services are killed with SIGKILL on reset)",
    "ONBUILD": "ONBUILD is not supported (images here are never bases of other Dockerfiles)",
}


def substitute(text: str, env: dict[str, str]) -> str:
    def one(m: re.Match) -> str:
        if m.group(0) == "\\$":
            return "$"
        name = m.group(1) or m.group(4)
        value = env.get(name, "")
        if m.group(2) == "-":
            return value or m.group(3)
        if m.group(2) == "+":
            return m.group(3) if value else ""
        return value

    return _VAR.sub(one, text)


def parse(path: Path) -> list[Instruction]:
    where = str(path)
    lines = path.read_text(encoding="utf-8").split("\n")
    out: list[Instruction] = []
    buf, start = "", 0
    directives = True
    for n, raw in enumerate(lines, start=1):
        stripped = raw.strip()
        if directives and re.match(r"#\s*escape\s*=", stripped):
            raise DockerfileError(f"{where}:{n}: the escape directive is not supported")
        if stripped.startswith("#") or not stripped:
            if not stripped:
                directives = False
            continue  # comments and empty lines, also inside a continuation (as Docker)
        directives = False
        if not buf:
            start = n
        if raw.rstrip().endswith("\\"):
            buf += raw.rstrip()[:-1] + " "
            continue
        buf += raw
        op, _, rest = buf.strip().partition(" ")
        out.append(Instruction(op.upper(), rest.strip(), start))
        buf = ""
    if buf.strip():
        op, _, rest = buf.strip().partition(" ")
        out.append(Instruction(op.upper(), rest.strip(), start))
    return out


def _json_or_shell(rest: str) -> list[str] | None:
    """The exec form (a JSON array of strings) or None for the shell form."""
    if rest.startswith("["):
        try:
            value = json.loads(rest)
        except json.JSONDecodeError:
            return None  # Docker too runs a malformed JSON array as a shell command
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return value
    return None


def _flags(rest: str, where: str, allowed: tuple[str, ...]) -> tuple[dict[str, str], str]:
    flags: dict[str, str] = {}
    while rest.startswith("--"):
        word, _, rest = rest.partition(" ")
        name, _, value = word[2:].partition("=")
        if name not in allowed:
            raise DockerfileError(f"{where}: the flag --{name} is not supported")
        flags[name] = value
        rest = rest.strip()
    return flags, rest


def _pairs(rest: str, where: str, op: str) -> dict[str, str]:
    words = shlex.split(rest)
    if words and "=" not in words[0]:  # the legacy `ENV key value with spaces` form
        key, _, value = rest.partition(" ")
        return {key: value.strip().strip('"')}
    out = {}
    for w in words:
        if "=" not in w:
            raise DockerfileError(f"{where}: {op} expects key=value pairs, got {w!r}")
        k, _, v = w.partition("=")
        out[k] = v
    return out


def _fetch_step(words: list[str], flags: dict[str, str], scope: dict[str, str], workdir: str,
                where: str, line: int) -> dict:
    """`ADD [--checksum=sha256:HEX] URL DEST` as a "fetch" step (`build.py` downloads it)."""
    if len(words) != 2 or not re.match(r"https?://[^/\s]+", words[0]):
        raise DockerfileError(f"{where}: ADD of a URL takes one http(s) URL and a destination "
                              f"(got {' '.join(words[:-1])!r}); --checksum only goes with a URL")
    checksum = flags.get("checksum")
    if checksum is not None and not re.fullmatch(r"sha256:[0-9a-f]{64}", checksum):
        raise DockerfileError(f"{where}: ADD --checksum={checksum}: expected sha256:<64 hex digits>")
    url, dest = words
    if dest.endswith("/"):
        name = posixpath.basename(url.split("?")[0].split("#")[0].rstrip("/"))
        if not name or "://" in name or name.count(":"):
            raise DockerfileError(f"{where}: ADD {url} {dest}: cannot name the file from the URL; "
                                  "give a file name as the destination")
        dest += name
    return {"kind": "fetch", "line": line, "url": url, "checksum": checksum,
            "path": posixpath.normpath(posixpath.join(workdir, dest)),
            "chown": substitute(flags.get("chown", ""), scope), "chmod": flags.get("chmod")}


def network_refusal(p: ImagePlan, where: str, network: bool) -> DockerfileError | None:
    """The error for the first step that needs the network, in a build not allowed it (`where`:
    the Dockerfile's name in messages), or None."""
    if network:
        return None
    hint = "build with --network (or the source harbor:DIR?network=1)"
    for step in p.steps:
        if step["kind"] == "fetch":
            return DockerfileError(f"{where}:{step['line']}: ADD of a URL ({step['url']}) needs "
                                   f"the network, which this build does not have: {hint}, or "
                                   "put the file in the task folder")
        if step.get("network") == "default":
            return DockerfileError(f"{where}:{step['line']}: RUN --network=default needs the "
                                   f"network, which this build does not have: {hint}")
    return None


def plan(path: Path) -> ImagePlan:
    """The plan of the Dockerfile at `path` (see the module docstring)."""
    path = Path(path)
    instructions = parse(path)
    args: dict[str, str] = {}
    result: ImagePlan | None = None
    shell = ["/bin/sh", "-c"]
    for ins in instructions:
        where = f"{path}:{ins.line}"
        op, rest = ins.op, ins.rest
        scope = {**args, **(result.env if result else {})}
        if op == "ARG":
            for word in shlex.split(rest):
                name, eq, default = word.partition("=")
                args[name] = substitute(default, scope) if eq else scope.get(name, "")
            continue
        if op == "FROM":
            if result is not None:
                raise DockerfileError(f"{where}: a second FROM (a multi-stage build) is not "
                                      "supported")
            if rest.startswith("--"):
                raise DockerfileError(f"{where}: FROM flags ({rest.split()[0]}) are not supported")
            words = substitute(rest, scope).split()
            if not words or (len(words) > 1 and not (len(words) == 3 and words[1].upper() == "AS")):
                raise DockerfileError(f"{where}: FROM expects an image name, got {rest!r}")
            result = ImagePlan(base=words[0], base_line=ins.line)
            continue
        if result is None:
            raise DockerfileError(f"{where}: {op} before FROM")
        if op in REFUSED:
            raise DockerfileError(f"{where}: {REFUSED[op]}")
        if op == "RUN":
            if "<<" in rest and re.search(r"<<-?\s*['\"]?\w+['\"]?\s*$", rest.split("\n")[0]):
                raise DockerfileError(f"{where}: RUN heredocs are not supported")
            flags, rest = _flags(rest, where, ("network",))
            if "network" in flags and flags["network"] not in ("default", "none"):
                raise DockerfileError(f"{where}: RUN --network={flags['network']} is not "
                                      "supported (default or none: a step gets the host's "
                                      "network with --network=default in a build allowed it)")
            argv = _json_or_shell(rest) or [*shell, rest]
            # the key only when given: the recipes and layers of other RUN steps keep their hash
            result.steps.append({"kind": "run", "line": ins.line, "argv": argv,
                                 "env": {**args, **result.env}, "user": result.user,
                                 "workdir": result.workdir,
                                 **({"network": flags["network"]} if "network" in flags else {})})
        elif op in ("COPY", "ADD"):
            flags, rest = _flags(rest, where, ("chown", "chmod", "link") +
                                 (("from",) if op == "COPY" else ("checksum",)))
            if "from" in flags:
                raise DockerfileError(f"{where}: COPY --from (multi-stage) is not supported")
            words = _json_or_shell(rest) or shlex.split(rest)
            words = [substitute(w, scope) for w in words]
            if len(words) < 2:
                raise DockerfileError(f"{where}: {op} needs a source and a destination")
            mode = flags.get("chmod")
            if mode is not None and not re.fullmatch(r"[0-7]{3,4}", mode):
                raise DockerfileError(f"{where}: {op} --chmod={mode}: only octal modes are supported")
            urls = [w for w in words[:-1] if re.match(r"https?://", w)]
            if urls or "checksum" in flags:
                result.steps.append(_fetch_step(words, flags, scope, result.workdir, where, ins.line))
                continue
            result.steps.append({"kind": "copy", "line": ins.line, "op": op, "sources": words[:-1],
                                 "dest": words[-1], "workdir": result.workdir,
                                 "chown": substitute(flags.get("chown", ""), scope),
                                 "chmod": mode})
        elif op == "WORKDIR":
            target = substitute(rest, scope).strip()
            if not target:
                raise DockerfileError(f"{where}: WORKDIR needs a directory")
            result.workdir = posixpath.normpath(posixpath.join(result.workdir, target))
            result.steps.append({"kind": "mkdir", "line": ins.line, "path": result.workdir})
        elif op == "ENV":
            result.env.update({k: substitute(v, scope) for k, v in _pairs(rest, where, op).items()})
        elif op == "LABEL":
            result.labels.update({k: substitute(v, scope) for k, v in _pairs(rest, where, op).items()})
        elif op == "MAINTAINER":
            result.labels["maintainer"] = rest
        elif op == "EXPOSE":
            result.exposed += substitute(rest, scope).split()
        elif op == "USER":
            result.user, result.user_line = substitute(rest, scope).strip(), ins.line
            if not result.user:
                raise DockerfileError(f"{where}: USER needs a user name or uid")
        elif op == "SHELL":
            value = _json_or_shell(rest)
            if not value:
                raise DockerfileError(f"{where}: SHELL needs a JSON array, e.g. [\"/bin/bash\", \"-c\"]")
            shell = value
        elif op in ("ENTRYPOINT", "CMD"):
            exec_form = _json_or_shell(rest)
            argv = exec_form if exec_form is not None else [*shell, rest]
            if op == "ENTRYPOINT":
                result.entrypoint, result.cmd = argv, None  # Docker: ENTRYPOINT resets CMD
            else:
                result.cmd = argv
        else:
            raise DockerfileError(f"{where}: unknown or unsupported instruction {op}")
    if result is None:
        raise DockerfileError(f"{path}: no FROM instruction")
    return result
