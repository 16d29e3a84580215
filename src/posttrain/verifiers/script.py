"""The `script` verifier: a task's check script, run in a fresh grading sandbox.

The check script (trusted, ours) runs as a grading program (`grading.run_grader`: nonce-marked
result, `-I`-like `sys.path`, non-dumpable) in a fresh sandbox holding a copy of the episode's
workspace (`grading.grading_context`): nothing the episode left running, nothing it planted in
`/tmp`, `$HOME` or `/dev/shm` is there. Policy programs a check runs (`run(argv)`) are its
subprocesses, started as the grading sandbox's candidate uid (see `grading.py`, "Two uids"): they
cannot forge its result, signal it or write its files; the workspace copy and their `$HOME` are
theirs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from posttrain.values.verdict import Verdict
from posttrain.verifiers.base import GradingFailed, Outcome, VerifierError, failed_grading, verdict
from posttrain.verifiers.grading import GRADER_MARGIN_S, grading_context, run_grader  # noqa: F401

if TYPE_CHECKING:
    from posttrain.values.task import Task

# --- check scripts ----------------------------------------------------------------------------

CHECK_PROGRAM = r'''
import stat, subprocess, tempfile
from pathlib import Path

WS = os.getcwd()
_HOME = tempfile.mkdtemp(prefix="ptcheck-home-")
MAX_READ = 1 << 20


class Fail(Exception):
    """raise Fail("reason") in a check: a failed verdict with that reason"""


def _path(rel):
    if os.path.isabs(rel) or ".." in rel.split("/"):
        raise ValueError(f"check scripts use workspace-relative paths, got {rel!r}")
    return os.path.join(WS, rel)


def info(rel):
    """lstat facts of a workspace path, or None: {"type": file|dir|link|other, "mode", "size"}"""
    try:
        st = os.lstat(_path(rel))
    except OSError:
        return None
    kind = ("file" if stat.S_ISREG(st.st_mode) else "dir" if stat.S_ISDIR(st.st_mode)
            else "link" if stat.S_ISLNK(st.st_mode) else "other")
    return {"type": kind, "mode": stat.S_IMODE(st.st_mode), "size": st.st_size}


def read_bytes(rel, limit=MAX_READ):
    """The bytes of a regular workspace file (symlinks, fifos and devices are refused: a policy
    could point them anywhere or make a read block), or None. Longer files raise Fail."""
    try:
        fd = os.open(_path(rel), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            return None
        if st.st_size > limit:
            raise Fail(f"{rel} is larger than {limit} bytes")
        return f.read(limit + 1)[:limit]


def read_text(rel, limit=MAX_READ):
    data = read_bytes(rel, limit)
    return None if data is None else data.decode("utf-8", errors="replace")


def files(rel="."):
    """Regular files under a workspace directory (not following links), sorted, relative to WS."""
    out = []
    for root, dirs, names in os.walk(_path(rel)):
        dirs[:] = sorted(d for d in dirs if not os.path.islink(os.path.join(root, d)))
        for name in names:
            full = os.path.join(root, name)
            if os.path.isfile(full) and not os.path.islink(full):
                out.append(os.path.relpath(full, WS))
    return sorted(out)


def run(argv, timeout=10.0, input=None, cwd=".", env=None):
    """Run a command in the workspace (no stdin unless given, its own session, killed with its
    process group at the timeout); returns (exit code or None on timeout, stdout, stderr)."""
    base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": _HOME, "LANG": "C.UTF-8",
            "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_PAGER": "cat",
            "GIT_TERMINAL_PROMPT": "0"}
    base.update(env or {})
    proc = subprocess.Popen(argv, cwd=_path(cwd), env=base, start_new_session=True, **as_candidate(),
                            stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = proc.communicate(input.encode() if input is not None else None, timeout=timeout)
        code = proc.returncode
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, 9)
        except OSError:
            pass
        out, err = proc.communicate()
        code = None
    return code, out.decode("utf-8", "replace")[:MAX_READ], err.decode("utf-8", "replace")[:4000]


def git(*args, timeout=10.0):
    """Read-only git plumbing in the workspace repository. Repository-local settings that would
    run programs (fsmonitor, pager) are overridden; checks use plumbing only (no status/diff)."""
    return run(["git", "-c", "core.fsmonitor=false", "-c", "safe.directory=*",
                "-c", "core.pager=cat", "--no-pager", *args], timeout=timeout)


policy_input()  # the check reads the workspace and may run the policy's programs
give_to_candidate(WS, _HOME)  # policy programs (`run`) write there, as the candidate uid
_ns = {"WS": WS, "Fail": Fail, "info": info, "read_bytes": read_bytes, "read_text": read_text,
       "files": files, "run": run, "git": git, "json": json, "os": os}
exec(compile(_PAYLOAD["check"], "<check>", "exec"), _ns)
try:
    _res = _ns["check"](_PAYLOAD.get("answer") or "", _PAYLOAD.get("args") or {})
except Fail as e:
    _res = {"passed": False, "reason": str(e)}
if isinstance(_res, bool):
    _res = {"passed": _res}
emit(_res)
'''


@dataclass(frozen=True)
class ScriptVerifier:
    """Runs a task's check script in the episode's sandbox after the episode.

    `task.verifier` settings:

    * `check` (str, required): Python source defining `check(answer, args) -> dict | bool`,
      run with the workspace as working directory. It returns `{"passed": bool, ...details}`
      or raises `Fail(reason)`. Helpers in scope: `info(path)`, `read_text(path)`,
      `read_bytes(path)`, `files(dir)`, `run(argv, timeout=)`, `git(*args)`, `WS`, `json`, `os`;
    * `args` (object): the hidden expected values, sent on stdin at grading time;
    * `timeout_s` (number, default 20): wall budget of the whole check, interpreter start included
      (policy programs the check runs need their own, shorter timeouts: see `run`).

    An exception in the check script (other than `Fail`) happens while it reads policy files, so
    it is a failed verdict (`GradingFailed`); `tasks check` shows a check bug as a failing oracle.
    Check scripts read policy files through the helpers, which refuse symlinks, fifos and
    oversized files instead of raising or blocking.
    """

    name: str = "script"
    version: str = "2"
    needs_sandbox: bool = True

    def verify(self, task: Task, outcome: Outcome) -> Verdict:
        settings = task.verifier
        check = settings.get("check")
        if not isinstance(check, str) or "def check" not in check:
            raise VerifierError(f"task {task.key}: verifier.check must be Python source defining "
                                f"check(answer, args)")
        timeout = float(settings.get("timeout_s", 20.0))
        payload = {"check": check, "args": settings.get("args") or {}, "answer": outcome.answer or ""}
        label = f"script verifier, task {task.key}"
        try:
            with grading_context(outcome, label=label) as sandbox:
                found = run_grader(sandbox, CHECK_PROGRAM, payload, timeout=timeout, label=label)
        except GradingFailed as e:
            return failed_grading(self, e)
        passed = found.pop("passed", None)
        if not isinstance(passed, bool):
            raise VerifierError(f"task {task.key}: check script returned no boolean 'passed' "
                                f"({found!r:.200})")
        return verdict(self, passed, **found)


SCRIPT = ScriptVerifier()
