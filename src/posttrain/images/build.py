"""Build a Dockerfile into cached layers, without a daemon (and without network unless asked).

`build(dockerfile)` plans it (`dockerfile.py`), resolves its base (`base.py`), and walks the
steps keeping a chain hash (`store.py`): a step whose layer is cached costs a directory lookup;
one that is not runs now:

* RUN: in a build sandbox over the layers so far (`open_sandbox(image=...)`): root, or the
  USER, inside a user namespace with its own uid range, over a writable overlay; no network at
  all (the sandbox has only its own loopback), unless the build is asked for it (`network=True`,
  `posttrain image build --network`, `harbor:DIR?network=1`): then RUN steps share the host's
  network namespace and see its `/etc/resolv.conf` and `/etc/hosts` (bound read-only, never
  committed), to reach package registries. Only build steps: an episode's sandbox over the
  image never has it. The layer cache does not depend on it (a step's layer is the same
  whichever way it was built). A failing step is a `BuildError` naming the
  Dockerfile line, with the end of its output. What the command changed is committed as the
  next layer (owners shifted back to image ids).
  A step's own `RUN --network=none` runs it without network in any build; `--network=default`
  asks for it and is an error naming the line in a build without it (the flag, when given, is
  part of the step's cache key, as in Docker).
* COPY/ADD: written by the host straight into a new layer: bytes, modes (setuid/setgid too),
  symlinks and empty directories as in the build context; owners root or `--chown`.
* ADD of an http(s) URL: downloaded by the host, only in a build allowed network, and cached as
  `fetch.py` says (keyed by URL + checksum with `--checksum`, else fetched on every build and
  keyed by the bytes).
* WORKDIR: a layer with the directory, if the image does not have it yet.

Builds are reproducible in what they are keyed by (the same Dockerfile and context on the same
host give the same chain, hence the same layers); a RUN's output is whatever the command
writes (a command that records the time differs from run to run, as with Docker).
"""

from __future__ import annotations

import fnmatch
import glob
import hashlib
import json
import os
import posixpath
import shutil
import stat
import time
import uuid
from pathlib import Path

from posttrain.images import base as bases
from posttrain.images.dockerfile import DockerfileError, ImagePlan, network_refusal, plan
from posttrain.images.fetch import FetchError, fetch
from posttrain.images.store import Image, cache_dir, load_image

RUN_TIMEOUT_S = 1800.0
NETWORK_HINT = ("builds run without network unless asked: a step that downloads packages (pip "
                "install of something not already installed, apt-get install of a package the "
                "host lacks) fails here; build with --network (or the source harbor:DIR?network=1)")


class BuildError(RuntimeError):
    """A step failed or cannot be done; the message names the Dockerfile and line."""


def _h(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:24]


# -- the build context --------------------------------------------------------------------------
def _ignored(context: Path) -> list[tuple[str, bool]]:
    path = context / ".dockerignore"
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            neg = line.startswith("!")
            out.append((posixpath.normpath(line.lstrip("!").strip("/")), neg))
    return out


def _is_ignored(rel: str, rules: list[tuple[str, bool]]) -> bool:
    hit = False
    for pattern, neg in rules:
        if fnmatch.fnmatch(rel, pattern) or rel.startswith(pattern.rstrip("*") + "/") and \
                not any(c in pattern for c in "*?["):
            hit = not neg
    return hit


def copy_entries(step: dict, context: Path, where: str) -> list[dict]:
    """The files a COPY/ADD step puts into the image: {"path", "type", "mode", "data"|"target"}
    (absolute image paths; directories first)."""
    rules = _ignored(context)
    dest = step["dest"]
    absdest = posixpath.normpath(posixpath.join(step["workdir"], dest))
    sources: list[Path] = []
    for src in step["sources"]:
        if "://" in src or src.startswith("git@"):
            raise BuildError(f"{where}: {step['op']} of a URL ({src}) is not supported: put the "
                             "file in the task folder (or fetch it in a RUN step of a build "
                             "with --network)")
        if posixpath.isabs(src) or ".." in Path(src).parts:
            raise BuildError(f"{where}: {step['op']} source {src!r} must be a path inside the "
                             f"build context ({context})")
        found = sorted(glob.glob(str(context / src))) if any(c in src for c in "*?[") else \
            ([str(context / src)] if os.path.lexists(context / src) else [])
        found = [f for f in found if not _is_ignored(os.path.relpath(f, context), rules)]
        if not found:
            raise BuildError(f"{where}: {step['op']} source {src!r} not found in {context}")
        sources += [Path(f) for f in found]
    into_dir = dest.endswith("/") or len(sources) > 1 or (len(sources) == 1 and sources[0].is_dir())
    mode_override = int(step["chmod"], 8) if step.get("chmod") else None
    out: list[dict] = []

    def add(host: Path, inside: str, top: bool) -> None:
        st = os.stat(host) if top else os.lstat(host)  # a top-level link is followed (Docker)
        mode = stat.S_IMODE(st.st_mode)
        if stat.S_ISLNK(st.st_mode):
            out.append({"path": inside, "type": "symlink", "target": os.readlink(host)})
        elif stat.S_ISDIR(st.st_mode):
            out.append({"path": inside, "type": "dir", "mode": mode_override or mode})
            for child in sorted(os.listdir(host)):
                rel = os.path.relpath(host / child, context)
                if not _is_ignored(rel, rules):
                    add(host / child, f"{inside}/{child}", False)
        elif stat.S_ISREG(st.st_mode):
            if step["op"] == "ADD" and _is_archive(host):
                raise BuildError(f"{where}: ADD of an archive ({host.name}) would be unpacked "
                                 "by Docker; that is not supported here: COPY it and RUN tar")
            out.append({"path": inside, "type": "file", "mode": mode_override or mode,
                        "data": host.read_bytes()})
        else:
            raise BuildError(f"{where}: {host} is not a file, directory or symbolic link")

    for src in sources:
        if src.is_dir():
            before = len(out)
            add(src, absdest, True)
            out[before]["mode"] = mode_override or 0o755  # the destination directory itself
        else:
            add(src, posixpath.join(absdest, src.name) if into_dir else absdest, True)
    return out


def _is_archive(path: Path) -> bool:
    with open(path, "rb") as f:
        head = f.read(262)
    return head[:2] == b"\x1f\x8b" or head[:3] == b"BZh" or head[:6] == b"\xfd7zXZ\x00" or \
        head[257:262] == b"ustar"


# -- users ----------------------------------------------------------------------------------------
def _image_file(layers: list[str], rel: str) -> str:
    for layer in reversed(layers):  # the top layer that has it wins (files are replaced whole)
        if os.path.isfile(os.path.join(layer, rel)):
            with open(os.path.join(layer, rel)) as f:
                return f.read()
    return ""


def resolve_user(spec: str, layers: list[str], where: str) -> tuple[int, int, str]:
    """USER `name[:group]` or `uid[:gid]` -> (uid, gid, home) as the image's /etc says."""
    if not spec:
        return 0, 0, "/root"
    name, _, group = spec.partition(":")
    users = {f[0]: f for f in (line.split(":") for line in
                               _image_file(layers, "etc/passwd").splitlines()) if len(f) >= 7}
    by_uid = {f[2]: f for f in users.values()}
    entry = users.get(name) or by_uid.get(name)
    if entry is None and not name.isdigit():
        raise BuildError(f"{where}: USER {spec}: no user {name!r} in the image's /etc/passwd")
    uid = int(entry[2]) if entry else int(name)
    gid = int(entry[3]) if entry else uid
    home = entry[5] if entry else "/"
    if group:
        groups = {f[0]: f[2] for f in (line.split(":") for line in
                                       _image_file(layers, "etc/group").splitlines()) if len(f) >= 3}
        if group.isdigit():
            gid = int(group)
        elif group in groups:
            gid = int(groups[group])
        else:
            raise BuildError(f"{where}: USER {spec}: no group {group!r} in the image's /etc/group")
    if not (0 <= uid < 65536 and 0 <= gid < 65536):
        raise BuildError(f"{where}: USER {spec}: ids must be below 65536 here")
    return uid, gid, home


# -- layers ---------------------------------------------------------------------------------------
def _write_copy_layer(dest: str, entries: list[dict], owner: tuple[int, int],
                      lower: list[str]) -> None:
    """A COPY layer: the parent directories (root's, 0755, only where the image lacks them),
    then every entry with its exact mode."""
    os.mkdir(dest, 0o755)
    for e in entries:
        path = dest + e["path"]
        parent = os.path.dirname(path)
        if not os.path.isdir(parent):
            os.makedirs(parent, 0o755)
            rel = os.path.dirname(e["path"])
            for layer in reversed(lower):  # keep the image's own directory attributes
                st = _lstat(layer + rel)
                if st is not None and stat.S_ISDIR(st.st_mode):
                    os.chmod(parent, stat.S_IMODE(st.st_mode))
                    os.chown(parent, st.st_uid, st.st_gid)
                    break
        if os.path.lexists(path) and e["type"] != "dir":
            os.unlink(path)
        if e["type"] == "dir":
            os.makedirs(path, exist_ok=True)
        elif e["type"] == "symlink":
            os.symlink(e["target"], path)
        else:
            with open(path, "wb") as f:
                f.write(e["data"])
        os.chown(path, *owner, follow_symlinks=False)
        if e["type"] != "symlink":
            os.chmod(path, e["mode"])  # after chown, which clears setuid/setgid


def _lstat(path: str):
    try:
        return os.lstat(path)
    except OSError:
        return None


def _exists_in(layers: list[str], host: list[list[str]], path: str) -> bool:
    if any(os.path.lexists(layer + path) for layer in layers):
        return True
    return any(path == at or path.startswith(at + "/") and os.path.lexists(hp + path[len(at):])
               for at, hp in host)


def _download(step: dict, where: str) -> bytes:
    try:
        return fetch(step["url"], step["checksum"], where)
    except FetchError as e:
        raise BuildError(str(e)) from None


def _fetch_entries(step: dict, chain: str, lower: list[str], where: str,
                   say) -> tuple[list[dict], tuple[int, int], str]:
    """(the file entry, its owner, the chain after it) of an `ADD URL` step (see `fetch.py`):
    keyed by URL + checksum when it has one (the bytes are fetched only if the layer is not
    cached: "data" None), else fetched now and keyed by their hash."""
    owner = (0, 0)
    if step["chown"]:
        uid, gid, _ = resolve_user(step["chown"], lower, where)
        owner = (uid, gid)
    mode = int(step["chmod"], 8) if step.get("chmod") else 0o600  # Docker's mode for a URL
    entry = {"path": step["path"], "type": "file", "mode": mode, "data": None}
    if step["checksum"]:
        return [entry], owner, _h(chain, "fetch", step["url"], step["checksum"], step["path"], mode, owner)
    data = _download(step, where)
    digest = hashlib.sha256(data).hexdigest()
    say(f"{where}: ADD {step['url']} has no --checksum: fetched again (sha256:{digest[:12]}); "
        "the image is keyed by what it served this time, not reproducible from the Dockerfile")
    return [{**entry, "data": data}], owner, _h(chain, "fetch", step["url"], digest, step["path"], mode, owner)


def _publish(tmp: str, final: Path) -> None:
    try:
        os.rename(tmp, final)
    except OSError:  # another build published the same layer first: same content, keep theirs
        shutil.rmtree(tmp, ignore_errors=True)


def _base_dir(kind: str) -> tuple[str, str]:
    digest = bases.base_digest(kind)
    final = cache_dir() / "bases" / digest
    if not final.is_dir():
        tmp = str(cache_dir() / "tmp" / uuid.uuid4().hex)
        bases.make_skeleton(tmp, kind)
        _publish(tmp, final)
    return digest, str(final)


def build(dockerfile: str | Path, *, context: str | Path | None = None, log=None,
          limits=None, network: bool = False) -> Image:
    """Build (or find in the cache) the image of `dockerfile`; `context` defaults to its folder.
    `log(text)` hears about every step. `network`: RUN steps share the host's network (see the
    module docstring). Raises DockerfileError or BuildError."""
    from posttrain.sandbox import Limits, open_sandbox
    from posttrain.sandbox.base import SandboxError
    from posttrain.sandbox.idmap import kernel_problem

    t0 = time.monotonic()
    dockerfile = Path(dockerfile).resolve()
    context = Path(context).resolve() if context else dockerfile.parent
    too_old = kernel_problem()
    if too_old is not None:  # an image it built could not run here either
        raise BuildError(f"{dockerfile}: cannot build here: {too_old}")
    say = log or (lambda text: None)
    p: ImagePlan = plan(dockerfile)
    refused = network_refusal(p, str(dockerfile), network)
    if refused is not None:
        raise refused
    try:
        base = bases.resolve_base(p.base)
    except bases.BaseImageError as e:
        raise DockerfileError(f"{dockerfile}:{p.base_line}: {e}") from None
    chain, base_dir = _base_dir(base["kind"])
    host = bases.host_lowers() + (bases.python_lowers() if base["kind"] == "python" else [])
    layers: list[str] = []
    stack = lambda: [base_dir] + layers  # noqa: E731 - bottom first
    limits = limits or Limits(wall_s=RUN_TIMEOUT_S, cpu_s=RUN_TIMEOUT_S, memory_mb=4096,
                              pids=1024, file_mb=4096, workspace_mb=8192, cpus=2.0)
    for step in p.steps:
        where = f"{dockerfile}:{step['line']}"
        if step["kind"] == "copy":
            entries = copy_entries(step, context, where)
            owner = (0, 0)
            if step["chown"]:
                uid, gid, _ = resolve_user(step["chown"], stack(), where)
                owner = (uid, gid)
            key = [(e["path"], e["type"], e.get("mode"), e.get("target"),
                    hashlib.sha256(e["data"]).hexdigest() if "data" in e else None)
                   for e in entries]
            chain = _h(chain, "copy", key, owner)
        elif step["kind"] == "fetch":
            entries, owner, chain = _fetch_entries(step, chain, stack(), where, say)
        elif step["kind"] == "mkdir":
            if _exists_in(stack(), host, step["path"]):
                continue
            chain = _h(chain, "mkdir", step["path"])
        else:
            uid, gid, home = resolve_user(step["user"], stack(), where)
            # the step's own --network, when given, is part of its key (not the build's)
            chain = _h(chain, "run", step["argv"], step["env"], step["workdir"], uid, gid,
                       *([step["network"]] if "network" in step else []))
        final = cache_dir() / "layers" / chain
        if final.is_dir():
            say(f"{where}: cached {step['kind']} layer {chain[:12]}")
            layers.append(str(final))
            continue
        tmp = str(cache_dir() / "tmp" / uuid.uuid4().hex)
        t1 = time.monotonic()
        if step["kind"] in ("copy", "fetch"):
            if step["kind"] == "fetch" and entries[0]["data"] is None:  # keyed by the checksum
                entries = [{**entries[0], "data": _download(step, where)}]
            _write_copy_layer(tmp, entries, owner, stack())
        elif step["kind"] == "mkdir":
            os.makedirs(tmp + step["path"], 0o755)
            for dirpath, _dirnames, _ in os.walk(tmp):
                os.chown(dirpath, 0, 0)
        else:
            partial = Image(digest="build-" + chain, source=str(dockerfile), base=p.base,
                            base_note=base["note"], base_dir=base_dir, host=host,
                            layers=list(layers), env=step["env"], uid=uid, gid=gid, home=home,
                            workdir=step["workdir"])
            try:
                step_network = network and step.get("network") != "none"
                config = {**partial.sandbox_config(workspace=False), "network": step_network}
                with open_sandbox(limits, image=config, clock=None) as sb:
                    result = sb.run(step["argv"], timeout=RUN_TIMEOUT_S)
                    if not result.ok:
                        why = (f"exit {result.exit_code}" if result.limit is None
                               else f"the {result.limit.value} limit")
                        tail = (result.stdout + result.stderr)[-1500:]
                        hint = ("it ran with the host's network" if step_network else
                                "it ran without network (RUN --network=none)" if network
                                else NETWORK_HINT)
                        raise BuildError(f"{where}: RUN failed ({why}); {hint}.\n"
                                         f"Output (end):\n{tail}")
                    sb.commit(tmp)
            except SandboxError as e:
                raise BuildError(f"{where}: the build sandbox failed: {e}") from e
        _publish(tmp, final)
        net = (" (with the host's network)" if network and step["kind"] == "run"
               and step.get("network") != "none" else "")
        say(f"{where}: built {step['kind']} layer {chain[:12]}{net} in {time.monotonic() - t1:.2f} s")
        layers.append(str(final))
    uid, gid, home = resolve_user(p.user, stack(), f"{dockerfile}:{p.user_line}")
    settings = [p.env, p.user, p.workdir, p.entrypoint, p.cmd, p.exposed, p.labels, host]
    digest = _h(chain, settings)
    image = load_image(digest)
    if image is not None:
        return image
    image = Image(digest=digest, source=str(dockerfile), base=p.base, base_note=base["note"],
                  base_dir=base_dir, host=host, layers=layers, env=p.env, user=p.user, uid=uid,
                  gid=gid, home=home, workdir=p.workdir, entrypoint=p.entrypoint, cmd=p.cmd,
                  exposed=p.exposed, labels=p.labels, built_at=time.time(),
                  build_s=round(time.monotonic() - t0, 3))
    image.save()
    return image
