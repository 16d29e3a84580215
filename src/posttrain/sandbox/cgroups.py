"""cgroup limits for one sandbox: memory, pids and CPU, on whatever this machine offers.

Machines differ: a pure v2 hierarchy (`memory.max`, `pids.max`, `cpu.max`, `cgroup.kill`), a
pure v1 one, or a hybrid (e.g. v1 memory/pids/cpu controllers plus a v2 mount that carries only
`hugetlb`). So nothing is assumed: `detect()` reads /proc/self/mounts and picks, per
controller, v2 when the v2 hierarchy really offers it, else a writable v1 mount, else nothing
(the sandbox then relies on rlimits alone, and `posttrain sandbox check` says so).

What a cgroup protects against: a fork bomb (pids), a memory bomb across many processes
(memory, with an OOM kill that is counted and reported as reason "memory"), CPU hogging beyond
the sandbox's share (cpu quota). It does not limit disk writes (the workspace tmpfs does) or
wall time (the supervisor's timeout does).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import secrets
import signal
import time

from posttrain.sandbox.base import Limits

CONTROLLERS = ("memory", "pids", "cpu")
PREFIX = "posttrain-sandbox-"
"""each sandbox's cgroup is a top-level `posttrain-sandbox-<random id>`. Top level on purpose:
under a shared parent, all sandboxes of the machine would share one CPU weight against every
ordinary process (a sandboxed command would run slower than the same command outside on a busy
machine); at the top level a sandbox weighs what one process weighs. A random id rather than the
supervisor's pid: nothing about the host is derived from the name."""
LOCK_DIR = "/run/posttrain/sandbox-cgroups"
"""one lock file per live sandbox cgroup, flocked by its supervisor for its life: a cgroup whose
lock can be taken belongs to a supervisor that died (see `collect_stale`)"""
CPU_PERIOD_US = 100_000


@functools.lru_cache(maxsize=1)
def detect() -> dict[str, tuple[str, str]]:
    """controller -> ("v2" | "v1", mount point), for the controllers usable here."""
    if os.geteuid() != 0:
        return {}  # creating cgroups needs root (or a delegated subtree we do not look for)
    v2_mount: str | None = None
    v1: dict[str, str] = {}
    try:
        with open("/proc/self/mounts") as f:
            mounts = [line.split() for line in f]
    except OSError:
        return {}
    for _dev, mnt, fstype, opts, *_ in mounts:
        options = opts.split(",")
        if fstype == "cgroup2" and v2_mount is None:
            v2_mount = mnt
        elif fstype == "cgroup" and "rw" in options:
            for c in CONTROLLERS:
                if c in options:
                    v1.setdefault(c, mnt)
    found: dict[str, tuple[str, str]] = {}
    if v2_mount is not None:
        try:
            with open(os.path.join(v2_mount, "cgroup.controllers")) as f:
                offered = f.read().split()
        except OSError:
            offered = []
        for c in CONTROLLERS:
            if c in offered and os.access(v2_mount, os.W_OK):
                found[c] = ("v2", v2_mount)
    for c in CONTROLLERS:
        if c not in found and c in v1 and os.access(v1[c], os.W_OK):
            found[c] = ("v1", v1[c])
    return found


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _read_kv(path: str) -> dict[str, int]:
    try:
        with open(path) as f:
            return {k: int(v) for k, v in (line.split() for line in f if line.strip())}
    except (OSError, ValueError):
        return {}


class SandboxCgroup:
    """The cgroup(s) of one sandbox: one directory per controller (v1) or one shared
    directory (v2). Create, add processes, read counters, kill everything, remove."""

    def __init__(self, name: str, limits: Limits, controllers: dict | None = None) -> None:
        self.controllers = dict(detect() if controllers is None else controllers)
        self.name = PREFIX + name
        """the directory name, unique on the machine (also found in /proc/<pid>/cgroup)"""
        self.dirs: dict[str, str] = {}
        self._peak_fd: int | None = None
        self._lock_fd: int | None = None
        v2 = {c for c, (ver, _) in self.controllers.items() if ver == "v2"}
        try:
            if v2:
                mnt = self.controllers[next(iter(v2))][1]
                enable = " ".join(f"+{c}" for c in sorted(v2))
                try:
                    _write(os.path.join(mnt, "cgroup.subtree_control"), enable)
                except OSError:
                    pass  # already enabled, or not ours to enable: the writes below will tell
                path = os.path.join(mnt, PREFIX + name)
                os.mkdir(path)
                for c in v2:
                    self.dirs[c] = path
            for c, (ver, mnt) in self.controllers.items():
                if ver == "v1":
                    path = os.path.join(mnt, PREFIX + name)
                    os.mkdir(path)
                    self.dirs[c] = path
            self._limit(limits)
        except BaseException:
            self.destroy()
            raise

    @classmethod
    def create(cls, limits: Limits) -> SandboxCgroup:
        """A cgroup with a fresh random name, locked as ours until this process exits."""
        os.makedirs(LOCK_DIR, mode=0o700, exist_ok=True)
        name = secrets.token_hex(8)
        fd = os.open(os.path.join(LOCK_DIR, PREFIX + name), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC,
                     0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)  # held (never released) until this process exits
        try:
            cg = cls(name, limits)
        except BaseException:
            os.unlink(os.path.join(LOCK_DIR, PREFIX + name))
            os.close(fd)
            raise
        cg._lock_fd = fd
        return cg

    @contextlib.contextmanager
    def joined(self):
        """Run the block (a spawn) with this process inside the cgroup, so that the child
        starts there; then move back. If where we came from is unknown, the block runs where we
        are (the caller adds the child afterwards)."""
        home = _own_cgroups(self.controllers)
        if home is None or not self.dirs:
            yield
            return
        me = str(os.getpid())
        try:
            for d in sorted(set(self.dirs.values())):
                _write(f"{d}/cgroup.procs", me)
            yield
        finally:
            for d in sorted(set(home.values())):
                try:
                    _write(f"{d}/cgroup.procs", me)
                except OSError:
                    pass

    def _v(self, c: str) -> str:
        return self.controllers[c][0]

    def _limit(self, limits: Limits) -> None:
        mem = limits.memory_mb << 20
        if "memory" in self.dirs:
            d = self.dirs["memory"]
            if self._v("memory") == "v2":
                _write(f"{d}/memory.max", str(mem))
                if os.path.exists(f"{d}/memory.swap.max"):
                    _write(f"{d}/memory.swap.max", "0")
            else:
                _write(f"{d}/memory.limit_in_bytes", str(mem))
                if os.path.exists(f"{d}/memory.memsw.limit_in_bytes"):
                    _write(f"{d}/memory.memsw.limit_in_bytes", str(mem))
        if "pids" in self.dirs:
            _write(f"{self.dirs['pids']}/pids.max", str(limits.pids))
        if "cpu" in self.dirs:
            quota = max(1000, int(limits.cpus * CPU_PERIOD_US))
            d = self.dirs["cpu"]
            if self._v("cpu") == "v2":
                _write(f"{d}/cpu.max", f"{quota} {CPU_PERIOD_US}")
            else:
                _write(f"{d}/cpu.cfs_period_us", str(CPU_PERIOD_US))
                _write(f"{d}/cpu.cfs_quota_us", str(quota))

    def add(self, pid: int) -> None:
        for d in sorted(set(self.dirs.values())):
            _write(f"{d}/cgroup.procs", str(pid))

    def counters(self) -> dict[str, int]:
        out = {}
        if "memory" in self.dirs:
            d = self.dirs["memory"]
            f = "memory.events" if self._v("memory") == "v2" else "memory.oom_control"
            out["oom_kill"] = _read_kv(f"{d}/{f}").get("oom_kill", 0)
        if "pids" in self.dirs:
            out["pids_max"] = _read_kv(f"{self.dirs['pids']}/pids.events").get("max", 0)
        return out

    def reset_peak(self) -> None:
        if "memory" not in self.dirs:
            return
        d = self.dirs["memory"]
        try:
            if self._v("memory") == "v1":
                _write(f"{d}/memory.max_usage_in_bytes", "0")
            else:  # v2: a write resets the peak as seen through this descriptor (Linux >= 6.12)
                if self._peak_fd is None:
                    self._peak_fd = os.open(f"{d}/memory.peak", os.O_RDWR | os.O_CLOEXEC)
                os.write(self._peak_fd, b"reset")
        except OSError:
            self._peak_fd = None

    def peak_mb(self) -> float | None:
        if "memory" not in self.dirs:
            return None
        d = self.dirs["memory"]
        try:
            if self._v("memory") == "v1":
                with open(f"{d}/memory.max_usage_in_bytes") as f:
                    return int(f.read()) / (1 << 20)
            if self._peak_fd is not None:
                return int(os.pread(self._peak_fd, 64, 0)) / (1 << 20)
            with open(f"{d}/memory.peak") as f:
                return int(f.read()) / (1 << 20)
        except (OSError, ValueError):
            return None

    def pids(self) -> set[int]:
        out: set[int] = set()
        for d in set(self.dirs.values()):
            try:
                with open(f"{d}/cgroup.procs") as f:
                    out.update(int(x) for x in f.read().split())
            except OSError:
                pass
        return out

    def kill_all(self) -> None:
        for d in set(self.dirs.values()):
            if os.path.exists(f"{d}/cgroup.kill"):
                try:
                    _write(f"{d}/cgroup.kill", "1")
                except OSError:
                    pass
        # v1 has no kill file: loop, since a process may fork while we kill its siblings
        for _ in range(100):
            pids = self.pids()
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            time.sleep(0.002)

    def destroy(self) -> None:
        if self._peak_fd is not None:
            os.close(self._peak_fd)
            self._peak_fd = None
        if self.dirs:
            self.kill_all()
        for d in sorted(set(self.dirs.values())):
            for _ in range(50):
                try:
                    os.rmdir(d)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.01)  # processes still exiting
        self.dirs.clear()
        if self._lock_fd is not None:
            try:
                os.unlink(os.path.join(LOCK_DIR, self.name))
            except OSError:
                pass
            os.close(self._lock_fd)
            self._lock_fd = None


def _own_cgroups(controllers: dict) -> dict[str, str] | None:
    """controller -> the directory of this process's cgroup, or None if one cannot be named
    (e.g. a path outside our cgroup namespace, shown as `/..`)."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = [line.rstrip("\n").split(":", 2) for line in f]
    except OSError:
        return None
    out = {}
    for c, (ver, mnt) in controllers.items():
        for _, names, path in lines:
            if (ver == "v2" and names == "") or (ver == "v1" and c in names.split(",")):
                if "/.." in path + "/":
                    return None
                out[c] = os.path.join(mnt, path.lstrip("/"))
                break
        else:
            return None
    return out


def _stale(name: str) -> bool:
    """True if the supervisor that made cgroup `name` is gone."""
    rest = name[len(PREFIX):]
    pid = rest.split("-")[0]
    if "-" in rest and pid.isdigit():  # the older `<pid>-<id>` names
        return not os.path.exists(f"/proc/{pid}")
    try:
        fd = os.open(os.path.join(LOCK_DIR, name), os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return False  # being created right now (the lock comes first) or already collected
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


def collect_stale() -> int:
    """Remove sandbox cgroups left by supervisors that were killed (empty ones only)."""
    n = 0
    gone: set[str] = set()
    for _ver, mnt in detect().values():
        try:
            names = [x for x in os.listdir(mnt) if x.startswith(PREFIX)]
        except OSError:
            continue
        for name in names:
            if _stale(name):
                try:
                    os.rmdir(os.path.join(mnt, name))
                    n += 1
                    gone.add(name)
                except OSError:
                    pass
    for name in gone:
        try:
            os.unlink(os.path.join(LOCK_DIR, name))
        except OSError:
            pass
    return n
