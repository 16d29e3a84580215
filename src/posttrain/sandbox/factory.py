"""`open_sandbox`: pick a backend, refuse to run untrusted code unsandboxed unless told to."""

from __future__ import annotations

import importlib.util
import logging
import os
import re
import warnings
from collections.abc import Sequence

from posttrain.sandbox.base import DEFAULT_CLOCK, Limits, Sandbox, SandboxUnavailable
from posttrain.sandbox.insidedir import check_module_file, inside_dir, is_module_file, split_preload

log = logging.getLogger("posttrain.sandbox")

BACKENDS = ("auto", "bwrap", "process")
ALLOW_ENV = "POSTTRAIN_ALLOW_UNSANDBOXED"
_MODULE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_warned: set[str] = set()


def _check_preload(preload: Sequence[str]) -> tuple[str, ...]:
    if isinstance(preload, str):
        raise ValueError(f"preload must be a sequence of module names, got the str {preload!r}")
    out = tuple(preload)
    for name in out:
        if isinstance(name, str) and is_module_file(name):
            check_module_file(name)
            continue
        if not (isinstance(name, str) and _MODULE_RE.match(name)):
            raise ValueError(f"preload: {name!r} is not a module name")
        # the sandbox sees the same site-packages: a module missing here is missing there
        if importlib.util.find_spec(name.split(".")[0]) is None:
            raise ValueError(f"preload: no module named {name.split('.')[0]!r} is installed")
    return out


def warn_unsandboxed(reason: str) -> None:
    msg = ("posttrain: running commands WITHOUT a sandbox (process backend): the code can read "
           "your files, use the network and act as your user. Use it for trusted code only. "
           f"Reason: {reason}")
    warnings.warn(msg, RuntimeWarning, stacklevel=3)
    if reason not in _warned:  # log once per reason: a pool would otherwise flood the log
        _warned.add(reason)
        log.warning(msg)


def check_available(*, backend: str = "auto", allow_unsandboxed: bool = False) -> None:
    """Raise `SandboxUnavailable` where `open_sandbox` with these settings would refuse a plain
    sandbox (no usable bubblewrap, an unsandboxed backend not allowed), without starting one: a
    run asks this before its minutes of checks and evaluation, not at its first episode."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    allow = bool(allow_unsandboxed) or os.environ.get(ALLOW_ENV, "") == "1"
    if backend == "process":
        if not allow:
            raise SandboxUnavailable(_PROCESS_REFUSED)
        return
    from posttrain.sandbox.bwrap import bwrap_problem

    problem = bwrap_problem()
    if problem is not None and not (backend == "auto" and allow):
        raise SandboxUnavailable(problem)


_PROCESS_REFUSED = ("the 'process' backend does not isolate anything; pass allow_unsandboxed=True "
                    f"(or set {ALLOW_ENV}=1) to run trusted code with it")


def open_sandbox(limits: Limits = Limits(), *, backend: str = "auto",
                 allow_unsandboxed: bool = False, preload: Sequence[str] = (),
                 clock: int | None = DEFAULT_CLOCK, image: dict | None = None,
                 two_uids: bool = False) -> Sandbox:
    """Start a fresh sandbox and return it (a context manager: `with open_sandbox() as sb:`).

    backend: "bwrap" (bubblewrap; what "auto" means), or "process" (no isolation, opt-in).
    With "auto" and no usable bubblewrap, this raises `SandboxUnavailable` naming the install
    command, unless `allow_unsandboxed=True` or `POSTTRAIN_ALLOW_UNSANDBOXED=1`: then it falls
    back to "process" with a loud warning. `preload`: modules the warm path imports once
    (e.g. ("numpy", "trimesh")), so that `run_python` jobs do not pay for them; an entry that is
    the path of a .py file shows that module at /opt/posttrain/inside (see `insidedir`). `clock`: the
    fixed time clock-dependent tools see (git dates, SOURCE_DATE_EPOCH; see `base.clock_env`),
    recorded in `info.clock`; None lets them read the real clock. `image`: a built image's
    root (`posttrain.images.Image.sandbox_config()`): commands run as the image's user (root by
    default, inside a user namespace) over a writable copy of it, in its working directory
    (bubblewrap only; see `posttrain.sandbox.imageroot`). `two_uids`: a grading sandbox whose
    grader (uid 1000) may start candidate programs as another uid (1001, another host uid) that
    cannot signal it or write its files (plain bubblewrap sandboxes only; ignored for an
    image and for the process backend, where `info.layers` then has no "two uids").
    """
    from posttrain.sandbox.client import SupervisedSandbox

    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if not isinstance(limits, Limits):
        raise TypeError(f"limits must be a posttrain.sandbox.Limits, got {limits!r}")
    preload = _check_preload(preload)
    allow = bool(allow_unsandboxed) or os.environ.get(ALLOW_ENV, "") == "1"
    if backend == "process":
        if not allow:
            raise SandboxUnavailable(_PROCESS_REFUSED)
        warn_unsandboxed("backend='process' was requested")
        return SupervisedSandbox(limits, mode="process", preload=preload, clock=clock,
                                 image=_process_image(), layers={"process": True})
    from posttrain.sandbox.bwrap import bwrap_problem, host_config, image_digest
    from posttrain.sandbox.idmap import kernel_problem

    problem = bwrap_problem()
    if image is not None:
        if problem is not None:
            raise SandboxUnavailable(f"an image sandbox needs the bubblewrap backend: {problem}")
        too_old = kernel_problem()
        if too_old is not None:
            raise SandboxUnavailable(too_old)
        return SupervisedSandbox(limits, mode="bwrap", preload=preload, clock=clock,
                                 image=str(image.get("digest", "image")),
                                 extra_config={**host_config(), "image": image})
    if problem is not None:
        if backend == "auto" and allow:
            warn_unsandboxed(problem)
            return SupervisedSandbox(limits, mode="process", preload=preload, clock=clock,
                                     image=_process_image(), layers={"process": True})
        raise SandboxUnavailable(problem)
    digest = image_digest(inside_dir(split_preload(preload)[1]))
    return SupervisedSandbox(limits, mode="bwrap", preload=preload, image=digest,
                             extra_config={**host_config(), "two_uids": bool(two_uids)}, clock=clock)


def _process_image() -> str:
    from posttrain.sandbox.bwrap import python_digest

    return "process:" + python_digest()
