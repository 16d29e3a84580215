"""Grading programs that run inside the sandbox, and the `script` verifier built on them.

Every verifier of the code, terminal and geometry families grades by sending a small Python
program into the episode's sandbox and reading back one result line. How that line is protected:

* the program runs through the sandbox's warm path (`run_python`: a fresh fork of the sandbox's
  resident interpreter, started before the policy acted) and its first statement removes the
  workspace and '' from `sys.path`, before any import: the effect of `python3 -I` (a planted
  `json.py` or `trimesh.py` cannot shadow an import) without paying a cold interpreter start.
  Candidate code is run by it in a separate `python3 -I` process (see `code.py`);
* its inputs (hidden test cases, expected values, check arguments) arrive on stdin at grading
  time, never through a workspace file the policy could have edited;
* its result is the last stdout line that starts with a marker holding a fresh random nonce
  (`@@ptgrade:<nonce>@@`), sent on stdin with the inputs. Anything the policy left behind can
  print whatever it likes: without the nonce it cannot print a result;
* the program marks itself non-dumpable (`prctl(PR_SET_DUMPABLE, 0)`), so processes it starts
  (candidate code, `git`, `bash test.sh`) cannot read its memory or its file descriptors through
  `/proc` (the bubblewrap backend also denies `ptrace` and `process_vm_readv`).

What this does *not* protect against: code that runs *inside* the grading process itself. The
verifiers here therefore run candidate code in a separate child process (see `code.py`), and a
check script (trusted, ours) only runs policy programs as subprocesses. A process of the same uid
can still kill or stop the grading program: that shows up as a `VerifierError` (infrastructure,
retried), never as a pass.

If the grading program does not print its result line (it crashed, it ran past its timeout, the
sandbox died), the verifier raises `VerifierError`: a broken grader is never a reward of 0.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from posttrain.values.verdict import Verdict
from posttrain.verifiers.base import Outcome, VerifierError, verdict

if TYPE_CHECKING:
    from posttrain.sandbox.base import RunResult, Sandbox
    from posttrain.values.task import Task

GRADER_MARGIN_S = 10.0
"""extra wall time a grading program gets beyond the budget it gives what it runs (start-up of
Python and trimesh on a busy machine, writing the result)"""

PRELUDE = r'''
import os, sys  # already loaded by every interpreter: no sys.path search happens here
_ws = os.path.realpath(os.getcwd())
sys.path[:] = [p for p in sys.path if p not in ("", ".")
               and not (os.path.realpath(p) + "/").startswith(_ws + "/")]
import ctypes, json
try:  # PR_SET_DUMPABLE (4) = 0: children of this process cannot read its memory or fds in /proc
    ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)
except Exception:
    pass
_PAYLOAD = json.loads(sys.stdin.buffer.read().decode("utf-8"))
_MARK = _PAYLOAD.pop("marker")
sys.stdin.close()


def emit(result):
    """Print the one result line (the host takes the last line that carries the marker)."""
    sys.stdout.flush()
    os.write(1, ("\n" + _MARK + json.dumps(result) + "\n").encode("utf-8"))
'''


def tail(text: str, n: int = 800) -> str:
    return text if len(text) <= n else "..." + text[-n:]


def run_grader(sandbox: Sandbox, program: str, payload: Mapping[str, Any], *, timeout: float,
               label: str) -> dict[str, Any]:
    """Run `PRELUDE + program` in `sandbox` (warm path) with `payload` (JSON) on stdin and
    return the JSON object it `emit`s. `label` names the verifier and task in errors.

    Raises `VerifierError` when the program does not emit (crash, timeout, broken sandbox)."""
    from posttrain.sandbox.base import LimitReason, SandboxError

    marker = f"@@ptgrade:{secrets.token_hex(16)}@@"
    stdin = json.dumps({**payload, "marker": marker})
    try:
        result: RunResult = sandbox.run_python(PRELUDE + program, stdin=stdin, timeout=timeout)
    except SandboxError as e:
        raise VerifierError(f"{label}: the sandbox failed while grading: {e}") from e
    for line in reversed(result.stdout.splitlines()):
        if line.startswith(marker):
            try:
                found = json.loads(line[len(marker):])
            except json.JSONDecodeError as e:
                raise VerifierError(f"{label}: unreadable grader result: {e}") from e
            if not isinstance(found, dict):
                raise VerifierError(f"{label}: grader result is not an object: {found!r:.200}")
            return found
    if result.limit is LimitReason.TIMEOUT:
        what = f"ran past its {timeout:g} s timeout"
    elif result.limit is not None:
        what = f"was killed by the {result.limit.value} limit"
    else:
        what = f"exited with status {result.exit_code}"
    raise VerifierError(f"{label}: the grading program {what} without a result; "
                        f"stderr: {tail(result.stderr)!r}")


@contextmanager
def grading_sandbox(outcome: Outcome) -> Iterator[Sandbox]:
    """The episode's sandbox, or a fresh default one (closed afterwards) when the verifier is
    called directly without one (e.g. grading a stored answer)."""
    if outcome.sandbox is not None:
        yield outcome.sandbox
        return
    from posttrain.sandbox import open_sandbox

    try:
        sandbox = open_sandbox()
    except Exception as e:  # SandboxError and backend start-up failures are infrastructure
        raise VerifierError(f"could not open a sandbox to grade in: {e}") from e
    with sandbox:
        yield sandbox


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
    proc = subprocess.Popen(argv, cwd=_path(cwd), env=base, start_new_session=True,
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

    An exception in the check script (other than `Fail`) is a bug of the check: `VerifierError`.
    Check scripts must therefore read policy files through the helpers, which refuse symlinks,
    fifos and oversized files instead of raising or blocking.
    """

    name: str = "script"
    version: str = "1"
    needs_sandbox: bool = True

    def verify(self, task: Task, outcome: Outcome) -> Verdict:
        settings = task.verifier
        check = settings.get("check")
        if not isinstance(check, str) or "def check" not in check:
            raise VerifierError(f"task {task.key}: verifier.check must be Python source defining "
                                f"check(answer, args)")
        timeout = float(settings.get("timeout_s", 20.0))
        payload = {"check": check, "args": settings.get("args") or {}, "answer": outcome.answer or ""}
        with grading_sandbox(outcome) as sandbox:
            found = run_grader(sandbox, CHECK_PROGRAM, payload, timeout=timeout,
                               label=f"script verifier, task {task.key}")
        passed = found.pop("passed", None)
        if not isinstance(passed, bool):
            raise VerifierError(f"task {task.key}: check script returned no boolean 'passed' "
                                f"({found!r:.200})")
        return verdict(self, passed, **found)


SCRIPT = ScriptVerifier()
