"""The sandbox contract: an isolated workspace plus process execution.

A `Sandbox` is what an episode acts in and what a verifier checks. Two kinds of failure are kept
apart on purpose:

* a command that fails (non-zero exit, killed by a limit, wrong output) is *data*: `run` returns a
  `RunResult` that says what happened, and the caller scores it;
* a sandbox that is broken (its supervisor died, it could not start, the backend is missing)
  raises `SandboxError`. The caller records an infrastructure failure and retries elsewhere; it
  must never turn that into a reward of 0.

Paths given to the file methods are relative to the workspace root (the working directory of
every command). Absolute paths, `..` components and symlinks that leave the workspace are
refused with `WorkspacePathError`.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from posttrain.sandbox.reset import ResetReport


class LimitReason(str, enum.Enum):
    """Why a limit, rather than the command itself, ended a run."""

    TIMEOUT = "timeout"  # wall-clock timeout; the whole process tree was killed
    CPU = "cpu"  # RLIMIT_CPU or the cgroup CPU budget
    MEMORY = "memory"  # cgroup OOM kill or address-space limit
    PIDS = "pids"  # process-count limit hit (fork failed)
    OUTPUT = "output"  # stdout/stderr flood past the hard cap: killed
    FILESIZE = "filesize"  # RLIMIT_FSIZE (SIGXFSZ)
    SIGNAL = "signal"  # killed by a signal that is none of the above


@dataclass(frozen=True)
class Limits:
    """Resource limits of one sandbox (and of each command run in it)."""

    wall_s: float = 10.0
    """wall-clock timeout of one command; the only limit that also catches a sleeping process"""
    cpu_s: float = 10.0
    """CPU seconds one command may use (RLIMIT_CPU; the cgroup quota where available)"""
    memory_mb: int = 1024
    """memory of the whole sandbox (cgroup) and address space of each process (RLIMIT_AS)"""
    pids: int = 64
    """processes and threads in the sandbox at once (pids cgroup, RLIMIT_NPROC)"""
    file_mb: int = 16
    """largest file a command may write (RLIMIT_FSIZE)"""
    open_files: int = 256
    """open file descriptors per process (RLIMIT_NOFILE)"""
    output_bytes: int = 1 << 20
    """stdout and stderr are each kept up to this many bytes; the rest is dropped and flagged"""
    output_kill_bytes: int = 4 << 20
    """a command that writes more than this to stdout or stderr is killed (reason `output`)"""
    workspace_mb: int = 256
    """size of the workspace tmpfs (a disk fill ends with ENOSPC, not a full host disk)"""
    cpus: float = 1.0
    """CPU share of the sandbox (cgroup cpu quota, in cores), where cgroups are available"""

    def __post_init__(self) -> None:
        for name in ("wall_s", "cpu_s", "cpus"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and 0 < value < math.inf):  # inf: no limit at all
                raise ValueError(f"Limits.{name} must be a positive, finite number, got {value!r}")
        for name in ("memory_mb", "pids", "file_mb", "open_files", "output_bytes",
                     "output_kill_bytes", "workspace_mb"):
            value = getattr(self, name)
            if not (isinstance(value, int) and not isinstance(value, bool) and value > 0):
                raise ValueError(f"Limits.{name} must be a positive integer, got {value!r}")
        if self.output_kill_bytes < self.output_bytes:
            raise ValueError("Limits.output_kill_bytes must be >= Limits.output_bytes "
                             f"({self.output_kill_bytes} < {self.output_bytes})")


@dataclass
class RunResult:
    """What one command did. Always returned for a command that ran, whatever it did."""

    exit_code: int | None
    """the exit status; None when a signal or a limit ended the command"""
    stdout: str
    stderr: str
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    wall_s: float = 0.0
    cpu_s: float = 0.0
    peak_memory_mb: float | None = None
    """peak memory of the sandbox during the command, where the backend can measure it"""
    limit: LimitReason | None = None
    """the limit that ended the command, if one did"""
    signal: int | None = None
    """the signal that ended the command, if one did"""

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and self.limit is None

    def to_dict(self) -> dict:
        d = asdict(self)
        d["limit"] = self.limit.value if self.limit else None
        return d

    @classmethod
    def from_dict(cls, d: Mapping) -> RunResult:
        d = dict(d)
        d["limit"] = LimitReason(d["limit"]) if d.get("limit") else None
        return cls(**d)


DEFAULT_CLOCK = 1_704_067_200
"""the sandbox's recorded clock by default: 2024-01-01T00:00:00Z, as seconds since the epoch"""


def clock_env(clock: int | None) -> dict[str, str]:
    """The variables that pin clock-dependent tools to `clock` (epoch seconds): git's author
    and committer dates (so commit hashes reproduce), `SOURCE_DATE_EPOCH` (honoured by many
    build and archive tools) and a fixed time zone. None: the tools read the real clock.

    Not covered: the kernel's clock itself (`date`, file mtimes, `time.time()`) is the host's;
    Linux has no namespace for the real-time clock."""
    if clock is None:
        return {}
    if isinstance(clock, bool) or not isinstance(clock, int) or clock < 0:
        raise ValueError(f"clock must be a non-negative integer (epoch seconds) or None, "
                         f"got {clock!r}")
    stamp = f"{clock} +0000"
    return {"SOURCE_DATE_EPOCH": str(clock), "GIT_AUTHOR_DATE": stamp,
            "GIT_COMMITTER_DATE": stamp, "TZ": "UTC"}


class SandboxError(RuntimeError):
    """The sandbox itself failed (infrastructure), as opposed to the command in it."""


class SandboxUnavailable(SandboxError):
    """The backend cannot run here (e.g. bubblewrap is not installed)."""


class SandboxBroken(SandboxError):
    """A running sandbox died or stopped answering; it must be replaced."""


class WorkspacePathError(ValueError):
    """A path that is absolute, contains `..`, or resolves outside the workspace."""


@dataclass(frozen=True)
class SandboxInfo:
    """Static facts about a sandbox, recorded in trajectories so a run can be re-run."""

    backend: str
    image: str
    """a hash of what the sandbox sees (root binds, interpreter, package set)"""
    layers: Mapping[str, bool] = field(default_factory=dict)
    """isolation layer name -> active here"""
    clock: int | None = None
    """the fixed clock that clock-dependent tools see (`clock_env`), recorded for replay"""
    modules: tuple[str, ...] = ()
    """host paths of the module files shown at /opt/posttrain/inside (preload entries that are
    files, see `insidedir`): a sandbox meant to be like this one (a grader's) is given them too"""


@runtime_checkable
class Sandbox(Protocol):
    """An isolated workspace with process execution. One per episode; never shared."""

    id: str
    info: SandboxInfo
    limits: Limits

    def run(
        self,
        command: str | Sequence[str],
        *,
        stdin: str | bytes | None = None,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
    ) -> RunResult:
        """Run `command` (a shell string run by `/bin/sh -c`, or an argv list) with the
        workspace as working directory. `timeout` defaults to `limits.wall_s`."""
        ...

    def run_python(
        self,
        code: str,
        *,
        stdin: str | bytes | None = None,
        timeout: float | None = None,
        args: Sequence[str] = (),
        cache: bool = False,
    ) -> RunResult:
        """Run Python source through the warm path (a forked child of a resident interpreter
        with heavy imports preloaded), under the same limits as `run`. `cache`: `code` is the
        host's own program, run many times (a grading program; never the policy's code): the
        resident interpreter may compile it once and keep it (a hint; an implementation may
        ignore it)."""
        ...

    def write_file(self, path: str, data: str | bytes, *, mode: int = 0o644) -> None:
        """Write a file (missing parent directories are created 0755); `mode` is exact,
        0..0o7777 (setuid, setgid and sticky bits kept)."""
        ...

    def make_dir(self, path: str, mode: int = 0o755) -> None:
        """Create a directory (an empty one stays), or set an existing one's exact mode."""
        ...

    def make_symlink(self, path: str, target: str) -> None:
        """Create a symbolic link; host-side file operations never follow it out of the
        workspace (`WorkspacePathError`)."""
        ...

    def read_file(self, path: str) -> bytes: ...

    def list_files(self, path: str = ".") -> list[str]:
        """Regular files under `path`, recursively, as sorted workspace-relative paths."""
        ...

    def snapshot(self) -> str:
        """Freeze the workspace; returns an id. Later writes never change a snapshot."""
        ...

    def restore(self, snapshot_id: str) -> None:
        """Make the workspace exactly what it was at `snapshot_id` (kills running jobs)."""
        ...

    def kill_processes(self) -> int:
        """Kill every process the episode left running in the sandbox (daemons, background
        jobs), keeping the sandbox itself usable; returns how many were killed. Environments call
        it before verification so nothing the policy started can touch the workspace while it is
        graded."""
        ...

    def archive(self) -> bytes:
        """The whole workspace as a deterministic tar archive (for trajectories and replay)."""
        ...

    def reset(self) -> ResetReport:
        """Make the sandbox what it was when it booted, for the next episode: every process
        killed (the job server stays), the workspace, /tmp, /dev/shm and $HOME back to pristine,
        snapshots dropped; then check it from the outside. `ResetReport.reusable` False: the
        sandbox must not serve another episode (the caller closes it)."""
        ...

    def close(self, wait: bool = True) -> None:
        """Kill everything in the sandbox and free it (`wait=False`: finish in the background;
        the sandbox is unusable from the moment of the call)."""
        ...

    @property
    def closed(self) -> bool: ...

    def __enter__(self) -> Sandbox: ...

    def __exit__(self, *exc: object) -> None: ...
