"""Episodes over images: which image a task runs in, its sandbox, its service.

A task that needs an image says so in `task.verifier["image"]`: `{"recipe": DIGEST,
"dockerfile": "<folder>/environment/Dockerfile"}`. The recipe digest is a hash of the
Dockerfile's plan and of every file it copies (not of the host), so the task's hash does not
depend on the machine; the folder name is for messages. `image_for(task)` builds the image the
first time (later: a cache lookup, milliseconds) from the Dockerfile registered under that
digest when the task folder was loaded in this process (`register`).

`task_sandbox(task, limits)` gives an episode a sandbox over the image (root, or the image's
USER, inside a user namespace, in its WORKDIR), which starts the image's service (`ENTRYPOINT`/
`CMD`) before the first turn and after every reset. The service's session is spared by
`kill_processes()` (what an environment calls before grading), so a task's tests see it
running, as they would in the container; what else the episode started is killed.

Where those sandboxes come from (`image_sandbox_mode()`, the environment variable
`POSTTRAIN_IMAGE_SANDBOXES`): "reset" (the default) takes a booted sandbox of the same image and
limits from this process's `episode_pool()` (a `ConfigPool`, the reset-to-pristine pool graders
use, but its own: an episode's sandbox never grades) and gives it back reset when the episode
ends: every process killed (daemons included), the whole root tree unmounted and mounted again
over the same image layers with empty writable uppers (what the episode wrote to /etc, /usr,
/home or /var, a user it added, is gone), /tmp and /dev/shm fresh, checked from the outside,
the service started again; a reset that is not clean closes the sandbox. "fresh" boots one per
episode and closes it after.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path

from posttrain.images.build import BuildError, build, copy_entries
from posttrain.images.dockerfile import ImagePlan
from posttrain.images.store import Image
from posttrain.sandbox.base import SandboxUnavailable
from posttrain.sandbox.keyed import ConfigPool

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


IMAGE_SANDBOXES_ENV = "POSTTRAIN_IMAGE_SANDBOXES"
IMAGE_SANDBOX_MODES = ("reset", "fresh")
_POOL: ConfigPool | None = None
_POOL_LOCK = threading.Lock()


def image_sandbox_mode() -> str:
    """"reset" (pooled sandboxes reset to pristine between episodes) or "fresh" (see the module
    docstring), from `POSTTRAIN_IMAGE_SANDBOXES`."""
    mode = os.environ.get(IMAGE_SANDBOXES_ENV) or "reset"
    if mode not in IMAGE_SANDBOX_MODES:
        raise ValueError(f"{IMAGE_SANDBOXES_ENV}={mode!r}: must be one of {', '.join(IMAGE_SANDBOX_MODES)}")
    return mode


def episode_pool() -> ConfigPool:
    """This process's pool of image sandboxes for episodes (created on first use)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ConfigPool()
        return _POOL


def close_episode_pool() -> None:
    """Close the idle pooled image sandboxes (a later episode starts a new pool); those left at
    exit are closed by their own finalizers."""
    global _POOL
    with _POOL_LOCK:
        pool, _POOL = _POOL, None
    if pool is not None:
        pool.close()


@contextlib.contextmanager
def task_sandbox(task, limits=None, *, fresh: bool | None = None) -> Iterator:
    """A pristine sandbox over `task`'s image with its service started: pooled and reset after
    the block, or booted for it and closed after (`fresh`; None: `image_sandbox_mode()`)."""
    from posttrain.sandbox import open_sandbox

    image = image_for(task)
    if image is None:
        raise ValueError(f"task {task.key} has no image")
    fresh = image_sandbox_mode() == "fresh" if fresh is None else fresh
    opener = open_sandbox if fresh else episode_pool().sandbox
    with opener(limits or limits_for(task), image=image.sandbox_config()) as sb:
        yield sb  # its service (if any) was started with it, or by its reset
