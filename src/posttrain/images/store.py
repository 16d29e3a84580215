"""The image cache: layers keyed by a chain of hashes, image manifests, list and prune.

    CACHE/bases/<base digest>/      the skeleton of a base (`base.py`)
    CACHE/layers/<chain>/           one build step's result (a tree with disk ids: 0 = root)
    CACHE/images/<digest>.json      an image: its layers, settings and where it came from

A layer's name is the hash of its parent's name and the step (its instruction, and for COPY the
bytes and modes of every file): two Dockerfiles that share a base and their first N steps share
those N layers, and an unchanged step is never run twice (Docker's layer cache). Layers are
written under a temporary name and renamed, so a killed build leaves no half layer behind.
CACHE is `$POSTTRAIN_IMAGE_CACHE`, else `/var/cache/posttrain/images` (it holds root-owned and
setuid files, so it is private to root: mode 0700).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

CACHE_ENV = "POSTTRAIN_IMAGE_CACHE"


def cache_dir() -> Path:
    path = Path(os.environ.get(CACHE_ENV) or "/var/cache/posttrain/images")
    for sub in ("bases", "layers", "images", "tmp"):
        (path / sub).mkdir(parents=True, exist_ok=True)
    os.chmod(path, 0o700)
    return path


@dataclass
class Image:
    """A built image: what an episode's sandbox is made of (`sandbox_config`)."""

    digest: str
    source: str
    """the Dockerfile it was built from"""
    base: str
    base_note: str
    base_dir: str
    host: list[list[str]]
    """(inside path, host path) directories borrowed from the host (`base.py`)"""
    layers: list[str]
    """layer directories, bottom first (the base skeleton not included)"""
    env: dict[str, str] = field(default_factory=dict)
    user: str = ""
    uid: int = 0
    gid: int = 0
    home: str = "/root"
    workdir: str = "/"
    entrypoint: list[str] | None = None
    cmd: list[str] | None = None
    exposed: list[str] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)
    built_at: float = 0.0
    build_s: float = 0.0

    @property
    def service(self) -> list[str] | None:
        """The command Docker would start (ENTRYPOINT + CMD, or CMD alone), if any."""
        argv = (self.entrypoint or []) + (self.cmd or [])
        return argv or None

    def sandbox_config(self, *, workspace: bool = True) -> dict:
        """What `open_sandbox(image=...)` takes: the layers top first, the image's user and
        environment; `workspace`: the WORKDIR is the snapshot-able workspace (an episode)."""
        return {"digest": self.digest, "layers": list(reversed(self.layers)) + [self.base_dir],
                "host": self.host, "workdir": self.workdir,
                "workspace": self.workdir if workspace and self.workdir != "/" else None,
                "env": dict(self.env), "uid": self.uid, "gid": self.gid, "home": self.home,
                "service": self.service}

    def save(self) -> None:
        path = cache_dir() / "images" / f"{self.digest}.json"
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(asdict(self), indent=1, sort_keys=True))
        tmp.rename(path)


def load_image(digest: str) -> Image | None:
    path = cache_dir() / "images" / f"{digest}.json"
    try:
        image = Image(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None
    if not all(os.path.isdir(p) for p in image.layers + [image.base_dir]):
        return None  # pruned underneath: rebuild
    return image


def list_images() -> list[Image]:
    out = []
    for path in sorted((cache_dir() / "images").glob("*.json")):
        image = load_image(path.stem)
        if image is not None:
            out.append(image)
    return sorted(out, key=lambda i: -i.built_at)


def tree_bytes(path: str) -> int:
    total = 0
    for dirpath, _, filenames in os.walk(path):
        for name in filenames:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                pass
    return total


def prune(everything: bool = False) -> dict[str, int]:
    """Delete layers and bases no image uses (`everything`: all images too), and leftovers of
    killed builds. Returns what was removed."""
    root = cache_dir()
    removed = {"images": 0, "layers": 0, "bases": 0, "tmp": 0}
    if everything:
        for path in (root / "images").glob("*.json"):
            path.unlink()
            removed["images"] += 1
    used = set()
    for image in list_images():
        used |= {os.path.basename(p) for p in image.layers + [image.base_dir]}
    for kind in ("layers", "bases"):
        for path in (root / kind).iterdir():
            if path.name not in used:
                shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink()
                removed[kind] += 1
    for path in (root / "tmp").iterdir():
        if time.time() - path.stat().st_mtime > 3600 or everything:
            shutil.rmtree(path, ignore_errors=True)
            removed["tmp"] += 1
    return removed
