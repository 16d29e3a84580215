"""Where graders run, and how their programs report: out of the policy's reach.

**The grading context.** A grader never runs where the episode acted. `grading_context` takes a
pristine grading sandbox (`grading_sandbox`: its own host uid, pid namespace, `/tmp`, `/dev/shm`
and workspace; nothing the episode started or planted is there) and copies in only the task's
declared artifacts from the episode's workspace (`include`: globs, default the whole workspace,
regular files, directories and symbolic links with their modes), then restores the task's
pristine input files over them (`pristine`), except those the task declares as outputs
(`writable`). The copy runs in the grading sandbox, at the start of the first grading program
(`run_grader`) of the context: one program per grade, not a copy program and then the grader
(each is a fork of the warm interpreter and a round trip). There is no fallback to the episode's
workspace or `/tmp`: when no grading sandbox can be had, grading is an infrastructure error.
Candidate code that a grader only *runs* (the `unit-tests` verifier's candidate process, a
geometry script) runs in the episode's own sandbox (`candidate_sandbox`), which is then never
used to grade.

**Where grading sandboxes come from.** By default (`grading_mode()` "reset") from a per-process
pool keyed by configuration (`posttrain.sandbox.keyed.ConfigPool`): booted by the pool itself,
reset to pristine after each grade (every process killed, /ws, /tmp, /dev/shm and $HOME restored,
then checked from the outside; a sandbox whose reset is not clean is discarded), so a grade costs
a reset (~5 ms) instead of a boot (~150-400 ms), and the reset runs after the grade has returned
(`background_reset`: the next grade of that configuration takes a sandbox whose reset is done).
An episode's sandbox never enters that pool. "fresh" (`set_grading_mode`, or
`POSTTRAIN_GRADING_SANDBOXES=fresh`) boots one per grade.

**Grading programs** (`run_grader`) are sent into the grading sandbox and read back one line:

* the program runs through the sandbox's warm path (`run_python`: a fresh fork of the sandbox's
  resident interpreter) and its first statement removes the workspace and '' from `sys.path`,
  before any import: the effect of `python3 -I` (a planted `json.py` cannot shadow an import);
* its inputs (hidden test cases, expected values, check arguments) arrive on stdin at grading
  time, never through a workspace file the policy could have edited;
* its result is the last stdout line that starts with a marker holding a fresh random nonce
  (`@@ptgrade:<nonce>@@`), sent on stdin with the inputs: without the nonce nothing can print
  a result;
* the program marks itself non-dumpable (`prctl(PR_SET_DUMPABLE, 0)`), so processes it starts
  cannot read its memory or file descriptors through `/proc` (the bubblewrap backend also denies
  `ptrace` and `process_vm_readv`).

**Failure semantics.** Before a grading program uses anything the policy made (a workspace file,
candidate code, candidate results) it calls `policy_input()`. If it then dies, hangs or garbles
its result, `run_grader` raises `GradingFailed` (a failed verdict, reason recorded); before that
point, and when the sandbox itself fails, it raises `VerifierError` (infrastructure, retried).
A grading program that starts by copying a context's artifacts has used the policy's files from
its first statement on: all of it counts as after `policy_input()` (as the copy alone did).

**Two uids.** A grading sandbox (bubblewrap, no image) has a user namespace of its own with
two uids, each a host uid of its own: the grading program runs as 1000, and the policy programs
it starts (`as_candidate()`: a Harbor `test.sh` and the code it tests, a check script's `run`)
as 1001 with no capability. Promised, against anything such a program does or leaves running:
it cannot signal, ptrace or read the memory, environment or descriptors of the grading program
(other uid; non-dumpable), and cannot write a file or directory the grader did not hand it
(`give_to_candidate`: the workspace copy, the tests' `$HOME`, Harbor's reward directory), so the
tests, the grader's scratch files and its result stay the grader's. The grader holds
CAP_SETUID/SETGID/KILL/CHOWN/DAC_READ_SEARCH in that namespace only, in its own process only
(nothing it execs inherits them); Harbor's grader uses CAP_KILL to end every candidate process
before it reads the reward.
Candidate code run *without* an episode sandbox (`candidate_sandbox`) gets a one-uid sandbox:
it never holds the grader's capabilities.

What this does *not* protect against: code running *inside* a test process (pytest importing
the agent's module) runs as the candidate uid like the test itself, so it can subvert that test
process and write what the test writes (Harbor's reward file, the pytest guard's record); see
the README's threat model. Image-based grading sandboxes (Harbor tasks with a Dockerfile) and
the unisolated process backend have one uid: there the policy's programs share the grading
program's uid (they still cannot forge its result: nonce, non-dumpable).
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from typing import TYPE_CHECKING, Any, cast

from posttrain.values.task import FileEntry
from posttrain.verifiers.base import GradingFailed, Outcome, VerifierError

if TYPE_CHECKING:
    from posttrain.sandbox.base import RunResult, Sandbox
    from posttrain.sandbox.keyed import ConfigPool

GRADER_MARGIN_S = 10.0
"""extra wall time a grading program gets beyond the budget it gives what it runs (start-up of
Python and trimesh on a busy machine, writing the result)"""

GRADING_PRELOAD = ("base64", "ctypes", "fnmatch", "io", "json", "pathlib", "shutil", "stat", "subprocess",
                   "tarfile", "tempfile")
"""standard modules grading programs import (`PRELUDE`, `EXTRACT`; `subprocess`, `tempfile` and
`pathlib` for those that run policy programs): the grading sandbox's warm interpreter imports them
once at boot, before anything of the policy's exists there, instead of every grade (~35 ms of CPU
per grade of a check script, more than the rest of it)"""

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
_CANDIDATE_UID = int(os.environ.get("POSTTRAIN_CANDIDATE_UID") or -1)


def _drop_caps():  # in the child, after the uid switch: it keeps no capability of ours
    if ctypes.CDLL(None).capset((ctypes.c_uint32 * 2)(0x20080522, 0), (ctypes.c_uint32 * 6)()):
        raise OSError("capset failed: not starting a policy program with our capabilities")


def as_candidate():
    """`subprocess.Popen` keyword arguments that start a policy program as the candidate uid
    with no capabilities (in a two-uid grading sandbox; elsewhere none)."""
    if _CANDIDATE_UID < 0:
        return {}
    return {"user": _CANDIDATE_UID, "group": _CANDIDATE_UID, "extra_groups": [],
            "preexec_fn": _drop_caps}


def give_to_candidate(*paths):
    """Hand files and directories (recursively, links not followed) to the candidate uid:
    the only places its programs may write besides /tmp (a two-uid sandbox; elsewhere a no-op)."""
    if _CANDIDATE_UID < 0:
        return

    def give(path):
        # a chown clears a file's setuid/setgid bits, and the grader (no CAP_FOWNER) could not
        # set them again: such a file stays the grader's, readable as its mode says, exact
        st = os.lstat(path)
        if not ((st.st_mode & 0o170000) == 0o100000 and st.st_mode & 0o6000):  # a regular file
            os.lchown(path, _CANDIDATE_UID, _CANDIDATE_UID)

    for top in paths:
        give(top)
        for d, dirs, names in os.walk(top):
            for n in dirs + names:
                give(os.path.join(d, n))


def emit(result):
    """Print the one result line (the host takes the last line that carries the marker)."""
    sys.stdout.flush()
    os.write(1, ("\n" + _MARK + json.dumps(result) + "\n").encode("utf-8"))


def policy_input():
    """Say, before it happens, that the policy's code or files are about to be used: from here
    on a crash, hang or garbled result of this program is the policy's failure (a failed
    verdict), not infrastructure (see `GradingFailed`)."""
    sys.stdout.flush()
    os.write(1, ("\n" + _MARK + '{"__policy_input__": true}\n').encode("utf-8"))
'''

POLICY_INPUT = "__policy_input__"


def tail(text: str, n: int = 800) -> str:
    return text if len(text) <= n else "..." + text[-n:]


def run_grader(sandbox: Sandbox, program: str, payload: Mapping[str, Any], *, timeout: float,
               label: str) -> dict[str, Any]:
    """Run `PRELUDE + program` in `sandbox` (warm path) with `payload` (JSON) on stdin and
    return the JSON object it `emit`s. `label` names the verifier and task in errors.

    When the program does not emit a readable result (crash, timeout, a broken sandbox, a
    garbled or absurdly nested line): `GradingFailed` if it had announced `policy_input()`
    (the policy may be the cause), else `VerifierError` (infrastructure)."""
    from posttrain.sandbox.base import LimitReason, SandboxError

    if isinstance(sandbox, _CopyPending):  # copy the artifacts first, in this same program
        artifacts, sandbox = sandbox.take(), sandbox.sandbox
        if artifacts is not None:
            program = f"{EXTRACT}_copy_artifacts(_PAYLOAD.pop({ARTIFACTS!r}))\n{program}"
            payload, timeout = {**payload, ARTIFACTS: artifacts}, timeout + copy_allowance(artifacts)
    marker = f"@@ptgrade:{secrets.token_hex(16)}@@"
    stdin = json.dumps({**payload, "marker": marker})
    touched, found, garbled = False, None, None
    try:
        # our own program, the same text every grade: the job server compiles it once
        result: RunResult = sandbox.run_python(PRELUDE + program, stdin=stdin, timeout=timeout, cache=True)
    except SandboxError as e:
        raise VerifierError(f"{label}: the sandbox failed while grading: {e}") from e
    for line in result.stdout.splitlines():
        if not line.startswith(marker):
            continue
        try:
            obj = json.loads(line[len(marker):])
        except (ValueError, RecursionError) as e:  # RecursionError: a deeply nested line
            garbled = f"unreadable grader result: {type(e).__name__}: {str(e)[:100]}"
            continue
        if not isinstance(obj, dict):
            garbled = f"grader result is not an object: {obj!r:.200}"
        elif obj.get(POLICY_INPUT) is True and len(obj) == 1:
            touched = True
        else:
            found, garbled = obj, None
    if found is not None:
        return found
    if garbled is not None:
        what = garbled
    elif result.limit is LimitReason.TIMEOUT:
        what = f"the grading program ran past its {timeout:g} s timeout without a result"
    elif result.limit is not None:
        what = f"the grading program was killed by the {result.limit.value} limit without a result"
    else:
        what = (f"the grading program exited with status {result.exit_code} (signal "
                f"{result.signal}) without a result")
    if touched:
        raise GradingFailed(f"{what}; stderr: {tail(result.stderr, 300)!r}")
    raise VerifierError(f"{label}: {what}; stderr: {tail(result.stderr)!r}")


MAX_ARTIFACT_BYTES = 32 << 20
"""a workspace (as a tar) larger than this is not copied into a grading sandbox: a failed verdict
(the policy filled it), never an infrastructure error"""

# Copies the episode's artifacts into the fresh grading workspace (trusted; the tar was made by
# the episode sandbox's supervisor, its contents by the policy). A function, so that its names
# never mix with the grading program's: `run_grader` runs it at the start of that program.
EXTRACT = r'''
def _copy_artifacts(p):
    import base64, fnmatch, io, shutil, stat, tarfile
    ws = os.path.realpath(os.getcwd())
    policy_input()
    include = p["include"]

    def wanted(name):
        return include is None or any(fnmatch.fnmatchcase(name, g) for g in include)

    def inside(path):
        parent = os.path.realpath(os.path.dirname(path))
        return parent == ws or parent.startswith(ws + "/")

    pristine_dirs = []
    for rel, entry in p["pristine"].items():  # the task's inputs first: they win over the episode's
        target = os.path.join(ws, rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if not inside(target) or os.path.lexists(target):
            continue
        if isinstance(entry, str):
            with open(target, "w") as f:
                f.write(entry)
        elif entry["kind"] == "dir":
            os.makedirs(target)
            pristine_dirs.append((target, entry["mode"]))
        elif entry["kind"] == "symlink":
            os.symlink(entry["target"], target)
        else:
            with open(target, "wb") as f:
                f.write(base64.b64decode(entry["b64"]))
            os.chmod(target, entry["mode"])  # after the last write, which would clear setuid/setgid

    def writable(name):
        return any(fnmatch.fnmatchcase(name, g) for g in p["writable"])

    dirs, copied = [], 0
    tf = tarfile.open(fileobj=io.BytesIO(base64.b64decode(p["tar"])), mode="r:")
    for m in tf:
        name = os.path.normpath(m.name)
        if name.startswith("/") or name.split("/")[0] in ("..", ".") or not wanted(name):
            continue
        target = os.path.join(ws, name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if not inside(target):
            continue
        if os.path.lexists(target) and not (os.path.isdir(target) and not os.path.islink(target)):
            # a task input (written above, or in the grading sandbox's image): kept pristine unless
            # the task declares it as the agent's to change
            if not (p["protect"] is False or writable(name)):
                continue
            os.unlink(target)
        if m.isdir():
            os.makedirs(target, exist_ok=True)
            dirs.append((target, m.mode & 0o7777))
        elif m.isfile():
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as f:
                shutil.copyfileobj(tf.extractfile(m), f)
                f.flush()  # the last write: it would clear setuid/setgid set before it
                os.fchmod(f.fileno(), m.mode & 0o7777)
            copied += 1
        elif m.issym():
            os.symlink(m.linkname, target)
    for d, mode in reversed(pristine_dirs + dirs):  # last: a read-only directory must not block its own contents
        os.chmod(d, mode)
    return copied
'''
EXTRACT_ALONE = EXTRACT + 'emit({"copied": _copy_artifacts(_PAYLOAD)})\n'
"""the copy as a program of its own (when the sandbox is used before any grading program)"""


@contextmanager
def candidate_sandbox(outcome: Outcome) -> Iterator[Sandbox]:
    """Where a grader *runs* candidate code (never where it judges): the episode's sandbox, or
    a default one-uid sandbox from the grading pool (given back, reset, afterwards) when the
    verifier is called without one (its jobs must not hold a two-uid grader's capabilities)."""
    if outcome.sandbox is not None:
        yield outcome.sandbox
        return
    with grading_sandbox(None, (), two_uids=False) as sandbox:
        yield sandbox


GRADING_SANDBOXES_ENV = "POSTTRAIN_GRADING_SANDBOXES"
GRADING_MODES = ("reset", "fresh")
_mode: str | None = None
_pool: Any = None
_pool_lock = threading.Lock()


def grading_mode() -> str:
    """Where grading sandboxes come from: "reset" (the default: a pool of booted sandboxes,
    reset to pristine after every grade) or "fresh" (a new sandbox per grade, closed after).
    Set with `set_grading_mode` or the environment variable `POSTTRAIN_GRADING_SANDBOXES`."""
    mode = _mode or os.environ.get(GRADING_SANDBOXES_ENV) or "reset"
    if mode not in GRADING_MODES:
        raise ValueError(f"{GRADING_SANDBOXES_ENV}={mode!r}: must be one of {', '.join(GRADING_MODES)}")
    return mode


def set_grading_mode(mode: str | None) -> None:
    """Choose "reset" or "fresh" grading sandboxes for this process (None: back to the
    environment variable, else "reset"). Switching to "fresh" closes the idle pooled ones."""
    global _mode
    if mode is not None and mode not in GRADING_MODES:
        raise ValueError(f"grading mode must be one of {', '.join(GRADING_MODES)}, got {mode!r}")
    _mode = mode
    if mode == "fresh":
        close_grading_pool()


def grading_pool() -> ConfigPool:
    """This process's pool of reset grading sandboxes (created on first use)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            from posttrain.sandbox.keyed import ConfigPool

            _pool = ConfigPool(background_reset=True)  # a grade does not wait for the reset
        return _pool


def close_grading_pool() -> None:
    """Close the idle grading sandboxes (a later grade starts a new pool). Sandboxes left at
    exit are closed by their own finalizers."""
    global _pool
    with _pool_lock:
        pool, _pool = _pool, None
    if pool is not None:
        pool.close()


@contextmanager
def grading_sandbox(like: Sandbox | None, preload: Sequence[str], image: dict | None = None,
                    limits: Any = None, two_uids: bool = True) -> Iterator[Sandbox]:
    """A pristine sandbox with the backend, limits and module files (`SandboxInfo.modules`) of
    `like` (the episode's): an episode that was allowed the unisolated process backend is graded
    with it too. `image`: the task's image
    (`posttrain.images`), when its tests must run over it. The one place graders get sandboxes.

    In "reset" mode (`grading_mode`) it comes from `grading_pool()`, keyed by its configuration
    (backend, limits, preloads, image): a sandbox that pool booted, reset to pristine after its
    previous grade (and discarded when that reset was not clean), never `like` itself or any
    sandbox an episode acted in. In "fresh" mode it is booted for this grade and closed after.
    A sandbox that cannot be had is an infrastructure error (`VerifierError`). `two_uids`
    (default): a two-uid sandbox where the backend offers one (see the module docstring)."""
    from posttrain.sandbox import Limits, open_sandbox

    limits = limits or (like.limits if like is not None else Limits())
    # the module files the episode's sandbox showed (a family's API the grader may run too)
    preload = (*preload, *(m for m in (like.info.modules if like is not None else ()) if m not in preload))
    preload = (*preload, *(m for m in GRADING_PRELOAD if m not in preload))
    backend = like.info.backend if like is not None and like.info.backend in ("bwrap", "process") else "auto"
    fresh = grading_mode() == "fresh"  # a bad setting is the user's error, not infrastructure
    stack = ExitStack()
    try:
        opener = open_sandbox if fresh else grading_pool().sandbox
        sandbox = stack.enter_context(opener(limits, backend=backend, allow_unsandboxed=backend == "process",
                                             preload=tuple(preload), image=image or None,
                                             two_uids=two_uids and not image))
    except Exception as e:  # SandboxError and backend start-up failures are infrastructure
        stack.close()
        raise VerifierError(f"could not open a sandbox to grade in: {e}") from e
    with stack:
        yield sandbox


@contextmanager
def grading_context(outcome: Outcome, *, include: Sequence[str] | None = None,
                    pristine: Mapping[str, str | FileEntry] | None = None, writable: Sequence[str] = (),
                    preload: Sequence[str] = (), image: dict | None = None, limits: Any = None,
                    label: str = "grader") -> Iterator[Sandbox]:
    """A fresh sandbox holding copies of the episode's artifacts (see the module docstring).

    `include`: workspace globs to copy (None: everything); `pristine`: the task's input files
    (text, or `FileEntry`s: bytes and exact modes, directories, links).
    When `pristine` is given (or an `image`), every path the fresh workspace already holds (the
    task's inputs, the image's files) keeps its pristine content unless it matches a `writable`
    glob (the task's outputs): edited or deleted input data is restored. `preload`: modules the
    grading sandbox's warm interpreter imports; `image`, `limits`: as for `open_sandbox`.

    The copy happens when the sandbox is first used: inside the first `run_grader` program,
    or before any other call (`_CopyPending`). Raises `GradingFailed` when the workspace is too
    large to copy (the policy filled it), or (from that first use) when the copy fails."""
    protect = pristine is not None or image is not None
    blob = outcome.sandbox.archive() if outcome.sandbox is not None else b""
    if len(blob) > MAX_ARTIFACT_BYTES:
        raise GradingFailed(f"the workspace is larger than {MAX_ARTIFACT_BYTES >> 20} MiB "
                            f"({len(blob) >> 20} MiB as a tar)")
    with grading_sandbox(outcome.sandbox, preload, image, limits) as sandbox:
        if not (blob or pristine):
            yield sandbox
            return
        payload = {"tar": base64.b64encode(blob or _EMPTY_TAR).decode(), "include":
                   None if include is None else list(include), "pristine": {
                       rel: e if isinstance(e, str) else e.model_dump(mode="json")
                       for rel, e in (pristine or {}).items()},
                   "writable": list(writable), "protect": protect}
        yield cast("Sandbox", _CopyPending(sandbox, payload, label))


ARTIFACTS = "__artifacts__"
"""the payload key under which `run_grader` hands a grading program the artifacts to copy"""
EXTRACT_TIMEOUT_S = 60.0
"""the timeout of the copy as a program of its own"""
COPY_S, COPY_BYTES_PER_S = 1.0, 8 << 20
"""what a grading program that copies the artifacts first gets beyond its own timeout: a second,
and one more per 8 MiB of artifacts (a few files take milliseconds); the grader's own budget is
otherwise unchanged"""


def copy_allowance(artifacts: Mapping[str, Any]) -> float:
    return COPY_S + len(artifacts.get("tar", "")) * 3 / 4 / COPY_BYTES_PER_S


class _CopyPending:
    """A grading context's sandbox whose artifacts are not copied yet. The first `run_grader`
    copies them at the start of its own grading program (one program, one fork of the warm
    interpreter, instead of two per grade); any other use of the sandbox first copies them with
    a program of their own, so every caller sees the artifacts in place. Either way the copy
    runs in the grading sandbox, announces `policy_input()` first, and happens once."""

    def __init__(self, sandbox: Sandbox, payload: dict[str, Any], label: str) -> None:
        self.sandbox, self._label = sandbox, label
        self._payload: dict[str, Any] | None = payload

    def take(self) -> dict[str, Any] | None:
        payload, self._payload = self._payload, None
        return payload

    def __getattr__(self, name: str) -> Any:
        value = getattr(self.sandbox, name)
        if callable(value):  # a method (run, read_file, ...): the artifacts must be there first
            payload = self.take()
            if payload is not None:
                run_grader(self.sandbox, EXTRACT_ALONE, payload, timeout=EXTRACT_TIMEOUT_S,
                           label=f"{self._label}: copying artifacts")
        return value


def _empty_tar() -> bytes:
    import io
    import tarfile

    buf = io.BytesIO()
    tarfile.open(fileobj=buf, mode="w").close()
    return buf.getvalue()


_EMPTY_TAR = _empty_tar()
