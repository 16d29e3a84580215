"""User-facing errors: a mistake in what the user asked for is one line on stderr, never a traceback.

`UserError(message, file=, field=, path=)` is what any layer raises when the *input* is wrong
(a config field, a path, a flag); the CLI prints it as

    error: my.toml: trainer.lr: Input should be a valid number (got 'fast')

and exits 2. `run_cli` is that boundary: it also turns the environment's refusals that are not
bugs (a full disk, a permission denied, a read-only file system, a missing or mistyped path)
into one line naming the path, exit 1, and so a missing program (`Unavailable`: no bubblewrap).
Anything else is a bug and keeps its traceback.
`POSTTRAIN_DEBUG=1` shows the traceback of every error, these included.

Exit codes of every `posttrain` command:

    0  the command did what it was asked and its result can be trusted
    1  a check failed (tasks check, a regression, contamination, a replay that diverged),
       or the environment refused (disk full, permission denied)
    2  bad input: a config, a flag, a path, a task file (this module's `UserError`)
    3  the result is not trustworthy, or not what was asked: too many infrastructure errors
       (see `posttrain.evaluation.trust`), a run whose training stopped before its last step
    130  interrupted (Ctrl-C)

This module imports nothing of the project: every layer may raise `UserError`.
"""

from __future__ import annotations

import errno
import os
import shutil
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

EXIT_CHECK_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_UNTRUSTWORTHY = 3

DEBUG_ENV = "POSTTRAIN_DEBUG"

# The environment's refusals a user can act on; a traceback would only hide the path.
_ENV_ERRNOS = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded",
               errno.EACCES: "permission denied", errno.EPERM: "operation not permitted",
               errno.EROFS: "read-only file system", errno.ENOENT: "no such file or directory",
               errno.ENOTDIR: "not a directory", errno.EISDIR: "is a directory",
               errno.ENAMETOOLONG: "file name too long"}


class Unavailable(Exception):
    """The machine lacks something the command needs (a program, a kernel feature): the message
    names it and how to get it. One line and exit 1, like the environment's other refusals."""


class UserError(Exception):
    """Bad input: the message says what is wrong and names where (file, field, path)."""

    def __init__(self, message: str, *, file: str | os.PathLike | None = None,
                 field: str | None = None, path: str | os.PathLike | None = None) -> None:
        self.message, self.file, self.field = message, file, field
        self.path = path
        super().__init__(self.line())

    def line(self) -> str:
        """`FILE: FIELD: MESSAGE (PATH)`, leaving out what is not known."""
        head = ": ".join(str(p) for p in (self.file, self.field) if p)
        text = f"{head}: {self.message}" if head else self.message
        if self.path is not None and str(self.path) not in text:
            text += f": {self.path}"
        return text


def no_space(path: str | os.PathLike, what: str = "") -> OSError:
    """The error to raise when a write to `path` failed because its disk is full."""
    return OSError(errno.ENOSPC, "no space left on device" + (f" ({what})" if what else ""), str(path))


@contextmanager
def writing(path: str | os.PathLike, what: str = "") -> Iterator[None]:
    """Name `path` in the error of a write to it that the environment refused: a `write()` or
    `flush()` on a full disk says only "No space left on device", naming no file, and a library
    (SQLite, Arrow, torch) says it in its own words. A full disk becomes `no_space(path, what)`;
    another refusal without a file name gets `path` as its file name."""
    try:
        yield
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT) or is_disk_full(e, path):
            raise no_space(path, what) from e
        if e.filename is None and e.errno in _ENV_ERRNOS:
            raise OSError(e.errno, e.strerror, str(path)) from e
        raise


def write_text_atomic(path: str | os.PathLike, text: str, what: str = "") -> None:
    """Write `text` to `path` whole or not at all (a temp file beside it, then a rename), with a
    refusal named as `writing` does: a full disk leaves neither a torn file nor a temp file."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with writing(path, what):
            tmp.write_text(text, encoding="utf-8")
            os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def is_disk_full(exc: BaseException, path: str | os.PathLike) -> bool:
    """Whether a failed write under `path` failed for lack of space. Libraries say so in their
    own words (torch: "enforce fail at inline_container.cc ... unexpected pos"; safetensors:
    "No space left on device (os error 28)"), so the file system is asked as well."""
    for e in _chain(exc):
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if "No space left on device" in str(e) or "os error 28" in str(e):
            return True
    # a refusal that names another cause (no such file, permission, read-only) is that cause
    if any(isinstance(e, OSError) and e.errno in _NOT_SPACE for e in _chain(exc)):
        return False
    probe = Path(path)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        usage = shutil.disk_usage(probe)
    except OSError:
        return False
    return usage.total > 0 and usage.free < 64 * 1024  # /proc, /sys: no blocks at all, not full


_NOT_SPACE = {errno.ENOENT, errno.EACCES, errno.EPERM, errno.EROFS, errno.EISDIR, errno.ENOTDIR}


def _chain(exc: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    while exc is not None and exc not in out:
        out.append(exc)
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    return out


def describe(exc: BaseException) -> tuple[int, str] | None:
    """(exit code, one line) for an error that is the user's input or the environment's
    refusal; None for anything else (a bug, which keeps its traceback)."""
    if isinstance(exc, UserError):
        return EXIT_BAD_INPUT, exc.line()
    if isinstance(exc, Unavailable):
        return EXIT_CHECK_FAILED, str(exc)
    if isinstance(exc, OSError) and exc.errno in _ENV_ERRNOS:
        what = exc.strerror or _ENV_ERRNOS[exc.errno]
        what = what[:1].lower() + what[1:]
        where = " -> ".join(str(f) for f in (exc.filename, exc.filename2) if f)
        return EXIT_CHECK_FAILED, f"{what}: {where}" if where else what
    return None


def run_cli(main: Callable[[], Any]) -> None:
    """Call `main()` (a click/typer app); a `UserError` or an environment refusal becomes one
    line on stderr and its exit code (see the module docstring)."""
    try:
        main()
    except Exception as e:  # noqa: BLE001 - re-raised unless it is one of ours
        found = describe(e)
        if found is None or os.environ.get(DEBUG_ENV):
            raise
        code, line = found
        sys.stdout.flush()
        print(f"error: {line}", file=sys.stderr)
        sys.exit(code)
