"""Episodes over images: which image a task runs in, its sandbox, its service.

A task that needs an image says so in `task.verifier["image"]`: `{"recipe": DIGEST,
"dockerfile": "<folder>/environment/Dockerfile"}`. The recipe digest is a hash of the
Dockerfile's plan and of every file it copies (not of the host), so the task's hash does not
depend on the machine; the folder name is for messages. `image_for(task)` builds the image the
first time (later: a cache lookup, milliseconds) from the Dockerfile registered under that
digest when the task folder was loaded in this process (`register`).

`task_sandbox(task, limits)` opens a sandbox over the image (root, or the image's USER, inside
a user namespace, in its WORKDIR), which starts the image's service (`ENTRYPOINT`/`CMD`) before
the first turn and after every reset. The service's session is spared by `kill_processes()`
(what an environment calls before grading), so a task's tests see it running, as they would in
the container; what else the episode started is killed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
from collections.abc import Iterator
from pathlib import Path

from posttrain.images.build import BuildError, build, copy_entries
from posttrain.images.dockerfile import ImagePlan
from posttrain.images.store import Image
from posttrain.sandbox.base import SandboxUnavailable

_RECIPES: dict[str, tuple[Path, bool]] = {}
"""recipe digest -> (its Dockerfile, whether its RUN steps may use the host's network)"""
_BUILT: dict[str, Image] = {}
_LOCK = threading.Lock()


class ImageUnavailable(SandboxUnavailable):
    """A task's image is neither built nor buildable here (an infrastructure error)."""


def recipe_digest(plan: ImagePlan, context: Path, where: str) -> str:
    """A hash of what the image is made of, independent of the host and of the folder's path."""
    steps: list = []
    for step in plan.steps:
        if step["kind"] == "copy":
            entries = copy_entries(step, context, f"{where}:{step['line']}")
            steps.append([step["line"], step["chown"], [
                (e["path"], e["type"], e.get("mode"), e.get("target"),
                 hashlib.sha256(e["data"]).hexdigest() if "data" in e else None)
                for e in entries]])
        else:
            steps.append({k: v for k, v in step.items() if k != "line"})
    blob = [plan.base, steps, plan.env, plan.user, plan.workdir, plan.entrypoint, plan.cmd,
            plan.exposed]
    return hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()[:24]


def register(digest: str, dockerfile: Path, *, network: bool = False) -> None:
    """`dockerfile` builds the image of recipe `digest` (`network`: its RUN steps may use the
    host's network; once any loader of the recipe asks for it, its builds have it)."""
    network = network or (digest in _RECIPES and _RECIPES[digest][1])
    _RECIPES[digest] = (Path(dockerfile), network)


def image_for(task) -> Image | None:
    """The built image of `task` (building it if needed), or None if it runs without one."""
    spec = task.verifier.get("image") if isinstance(task.verifier, dict) else None
    if not spec:
        return None
    digest = spec["recipe"]
    with _LOCK:
        if digest in _BUILT:
            return _BUILT[digest]
        recipe = _RECIPES.get(digest)
        if recipe is None:
            raise ImageUnavailable(_why_unknown(task.key, digest, str(spec.get("dockerfile"))))
        try:
            image = build(recipe[0], network=recipe[1])
        except (BuildError, ValueError, OSError) as e:
            raise ImageUnavailable(f"task {task.key}: building its image failed: {e}") from e
        _BUILT[digest] = image
        return image


def _why_unknown(key: str, digest: str, label: str) -> str:
    """Why the image of recipe `digest` (from the Dockerfile `label`, '<folder>/environment/
    Dockerfile') cannot be built here: its folder was not loaded, or it was and now makes
    another image (a replay of a run after the task folder changed)."""
    now = [(d, path) for d, (path, _) in _RECIPES.items() if str(path).endswith("/" + label)]
    if now:
        other, path = now[0]
        return (f"task {key}: the image it ran over (recipe {digest[:12]}, from {label}) cannot "
                f"be built again: {path} (or a file it copies) changed since; it now makes "
                f"recipe {other[:12]}")
    return (f"task {key}: its image (recipe {digest[:12]}, from {label}) was not loaded in this "
            "process; load its task folder (--source harbor:DIR) to build it")


def limits_for(task):
    """An image episode's limits: the task's memory and command timeout; room on the sandbox's
    tmpfs for what the episode writes over the image (package installs included)."""
    from posttrain.sandbox import Limits

    t = task.limits
    return Limits(wall_s=t.command_timeout_s, cpu_s=t.command_timeout_s, memory_mb=t.memory_mb,
                  pids=256, file_mb=1024, workspace_mb=2048)


@contextlib.contextmanager
def task_sandbox(task, limits=None) -> Iterator:
    """A fresh sandbox over `task`'s image with its service started (closed afterwards)."""
    from posttrain.sandbox import open_sandbox

    image = image_for(task)
    if image is None:
        raise ValueError(f"task {task.key} has no image")
    with open_sandbox(limits or limits_for(task), image=image.sandbox_config()) as sb:
        yield sb  # its service (if any) was started with it
