"""Reset to pristine between episodes: what a reset found, and whether the sandbox may serve again.

Booting a sandbox costs ~150 ms (namespaces, mounts, a job server importing its preloads); a
reset costs a few milliseconds: kill every process but the job server, unmount the episode's
/ws, /tmp and /dev/shm and mount fresh ones (`overlay.py`), remove System V IPC objects, then
look at the sandbox *as the next episode will see it* (through its own mount namespace) and
check that nothing is left. When the job server died during the episode (under bubblewrap it is
the sandbox's pid 1, which nothing inside can kill: the OOM killer, a kill from outside),
the bubblewrap backend kills the rest, remounts, and starts a new job server before the probe
(its pid namespace ended with the old one; the details say `server_restarted`): a server start
instead of a boot. The backends gather the facts (I/O); this module decides, as plain
functions of those facts, so every rule is testable without a sandbox:

* `judge(facts)`: reusable only if every process died, the job server is healthy, the remounts
  succeeded and the probe found nothing (no entry in a writable place, a writable place's root
  with its pristine owner and mode, one fresh mount per writable place, no IPC object);
* `after_episode(...)`: what the pool does with a sandbox an episode gave back (reset and reuse,
  or close it and boot another).

What a reset does not cover (a fresh sandbox does not either): the kernel state shared by every
process on the machine (page cache timing, `/proc/loadavg`); pid numbers keep increasing inside
the sandbox, so an episode can tell how many processes ran before it in that sandbox.
"""

from __future__ import annotations

from dataclasses import dataclass, field

WRITABLE = ("/ws", "/tmp", "/dev/shm")
"""the places a sandboxed process can write (everything else is read-only or per-process)"""
PRISTINE_MODE = 0o755


@dataclass(frozen=True)
class PlaceState:
    """One writable place as the sandbox sees it after the remount."""

    path: str
    entries: tuple[str, ...] = ()
    """names found in it (a pristine place is empty)"""
    owner_ok: bool = True
    """its root belongs to the sandbox's uid"""
    mode: int = PRISTINE_MODE
    mounts: int = 2
    """mounts stacked at the path (the base and one fresh top)"""
    expected_mode: int = PRISTINE_MODE
    """the mode of the place's root in a fresh sandbox"""


@dataclass(frozen=True)
class ResetFacts:
    """What a backend observed while resetting (the input of `judge`)."""

    killed: int | None
    """processes killed; None if they did not all die"""
    server: str = "ok"
    """"ok", or why the job server cannot serve another episode"""
    restore_error: str | None = None
    """why remounting a writable place failed, if it did"""
    places: tuple[PlaceState, ...] = ()
    processes_left: tuple[int, ...] = ()
    """pids still in the sandbox besides its init and job server, after the kill"""
    ipc_left: int = 0
    """System V IPC objects still there after the cleanup"""
    expected_mounts: int = 2
    """how many mounts a pristine writable place has (the process backend has no mounts: 0)"""


@dataclass(frozen=True)
class ResetReport:
    reusable: bool
    reason: str = ""
    """why not, when not reusable (empty otherwise)"""
    killed: int = 0
    seconds: float = 0.0
    """time the supervisor spent on the reset"""
    details: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"reusable": self.reusable, "reason": self.reason, "killed": self.killed,
                "seconds": self.seconds, "details": dict(self.details)}

    @classmethod
    def from_dict(cls, d: dict) -> ResetReport:
        return cls(bool(d["reusable"]), str(d.get("reason", "")), int(d.get("killed", 0)),
                   float(d.get("seconds", 0.0)), dict(d.get("details", {})))


def judge(facts: ResetFacts) -> tuple[bool, str]:
    """(reusable, reason): the first problem found, in the order a reset does its work."""
    if facts.killed is None:
        return False, "processes survived SIGKILL"
    if facts.processes_left:
        return False, f"processes left after the kill: {list(facts.processes_left)[:5]}"
    if facts.server != "ok":
        return False, f"job server: {facts.server}"
    if facts.restore_error:
        return False, f"restore failed: {facts.restore_error}"
    for p in facts.places:
        if p.entries:
            return False, f"{p.path} not empty after the reset: {sorted(p.entries)[:5]}"
        if not p.owner_ok or p.mode != p.expected_mode:
            return False, f"{p.path} has owner/mode off after the reset (mode {p.mode:o})"
        if p.mounts != facts.expected_mounts:
            return False, (f"{p.path} has {p.mounts} mounts after the reset "
                           f"(expected {facts.expected_mounts})")
    if facts.ipc_left:
        return False, f"{facts.ipc_left} System V IPC objects survived the cleanup"
    return True, ""


def count_mounts(mountinfo: str, path: str) -> int:
    """How many mounts `/proc/PID/mountinfo` shows at `path` (stacked mounts share it)."""
    n = 0
    for line in mountinfo.splitlines():
        fields = line.split()
        if len(fields) > 4 and fields[4] == path:
            n += 1
    return n


def after_episode(*, reuse: bool, closed: bool, episodes: int, max_episodes: int) -> str:
    """What the pool does with a sandbox an episode gave back: "reset" (then reuse it if the
    reset says so) or "close" (and boot another). A sandbox serves at most `max_episodes`."""
    if not reuse or closed or episodes >= max_episodes:
        return "close"
    return "reset"


def still_alive(sandbox) -> bool:
    """Whether a pool may hand out `sandbox`, which answered its supervisor's last request (its
    boot, or a clean reset): the supervisor has not exited since. No round trip (a ping costs
    a few milliseconds on a busy machine, at every checkout); a supervisor that hangs instead is
    found by the first request, which then fails as `SandboxBroken`."""
    try:
        return bool(sandbox.alive(probe=False))
    except TypeError:  # a Sandbox implementation without the cheap check
        return bool(sandbox.alive())
