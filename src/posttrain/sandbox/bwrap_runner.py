"""Supervisor-side half of the bubblewrap backend (see `bwrap.py` for the design and the
layers). Runs as root in the supervisor's private mount namespace."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import resource
import select
import shutil
import signal
import stat
import time

from posttrain.sandbox import ipc, mounts, rootfs
from posttrain.sandbox.base import Limits, clock_env
from posttrain.sandbox.bwrap import INSIDE_UID, PR_SET_CHILD_SUBREAPER, RUN_DIR, WS
from posttrain.sandbox.cgroups import SandboxCgroup, collect_stale, detect
from posttrain.sandbox.imageroot import ImageRoot
from posttrain.sandbox.overlay import OverlayWorkspace, TmpfsStack
from posttrain.sandbox.reset import WRITABLE, PlaceState, ResetFacts, count_mounts
from posttrain.sandbox.rlimits import rlimit_table

NET_FILES = ("/etc/resolv.conf", "/etc/hosts")
"""what a build step with the host's network sees of the host's configuration (as Docker)"""
DOCKER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
ROOT_CAPS = ("CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD",
             "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE",
             "CAP_KILL", "CAP_AUDIT_WRITE")
"""Docker's default capabilities (less NET_RAW and SYS_CHROOT, whose syscalls the seccomp list
denies or the empty network makes moot), held by an image sandbox's root inside its namespace"""

def _pipe_with(data: bytes) -> int:
    """The read end of a pipe that holds `data` and then EOF (bubblewrap reads it to the end)."""
    r, w = os.pipe2(os.O_CLOEXEC)
    try:
        view = memoryview(data)
        while view:  # the arguments are a few KiB: within the pipe buffer, this never blocks
            view = view[os.write(w, view):]
    finally:
        os.close(w)
    return r


def _server_state(pid: int | None) -> str:
    """"ok" if the job server is running or waiting (not stopped, traced or dying)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError, TypeError):
        return "gone"
    return "ok" if state in ("R", "S") else f"in state {state!r}"


class SpawnError(RuntimeError):
    """bubblewrap could not create the sandbox (an infrastructure failure)."""


def _read_child_pid(fd: int, timeout: float = 30.0) -> int | None:
    """bubblewrap's --info-fd JSON: {"child-pid": N, ...}; None if it closed the fd first."""
    data = b""
    deadline = time.monotonic() + timeout
    while b"}" not in data:
        r, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not r:
            raise SpawnError(f"bubblewrap did not report its pid within {timeout:.0f} s")
        chunk = os.read(fd, 4096)
        if not chunk:
            return None
        data += chunk
    return int(json.loads(data)["child-pid"])


def _uid_processes(uid: int):
    """(pid, /proc status fields) of the live processes whose real uid is `uid`."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status") as f:
                text = f.read()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
        if fields.get("State", "").split()[:1] == ["Z"]:
            continue
        if int(fields.get("Uid", "-1 0").split()[0]) == uid:
            yield int(name), fields


def _ns_ids(pid: int) -> tuple[int, int]:
    """(pid, session id) of a process as seen in its own (innermost) pid namespace."""
    try:
        with open(f"/proc/{pid}/status") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        return int(fields["NSpid"].split()[-1]), int(fields["NSsid"].split()[-1])
    except (OSError, KeyError, ValueError, IndexError):
        return (-1, -1)


class BwrapHandle:
    """One bubblewrap process tree. Killing the outer bwrap kills its pid 1
    (--die-with-parent), and the death of a pid namespace's pid 1 kills everything in it."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.pidfd = os.pidfd_open(pid)
        self.init_pid: int | None = None
        """bubblewrap's pid 1 in the sandbox's pid namespace, as a host pid"""

    def kill(self) -> None:
        try:
            signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
        except OSError:
            pass

    def close(self) -> None:
        os.close(self.pidfd)


class BwrapRunner:
    kind = "bwrap"

    def __init__(self, cfg: dict) -> None:
        self.cfg = cfg
        self.limits = Limits(**cfg["limits"])
        self.uid = cfg["uid"] if cfg["uid"] is not None else os.getuid()
        self.layout = cfg["layout"]
        self.seccomp: bytes | None = cfg["seccomp"]
        self.mnt = cfg["mountpoint"]
        self.inside_ws = WS
        self.overlay = OverlayWorkspace(self.uid)
        self.has_workspace = True
        """False for an image build step: everything goes to the root's upper layer"""
        self.image: dict = cfg.get("image") or {}
        """an image sandbox's image (root in a user namespace over it, `imageroot.py`), or {}"""
        self.iroot: ImageRoot | None = None
        self.service_sids: set[int] = set()
        """sessions (as seen inside) of an image's service, spared by `kill_processes` (not by
        a reset, a restore or the end of the sandbox)"""
        self.extra_fds: tuple[int, ...] = ()
        if self.image:
            self.inside_ws = self.image.get("workspace") or self.image["workdir"]
        self.cg: SandboxCgroup | None = None
        self.infra: set[int] = set()
        """host pids of the server's bubblewrap and the server: not the job's to lose"""
        self.server_pid: int | None = None
        self.init_pid: int | None = None
        """bubblewrap's pid 1 of the running job server: the sandbox's namespaces"""
        # the job server sets RLIMIT_CPU for each job itself (its own idle life is not a job's)
        self.rlimits = rlimit_table(self.limits, memory_cgroup="memory" in detect(), cpu=False)

    # -- boot ----------------------------------------------------------------------------
    def boot(self) -> dict:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)  # orphans come to us, and are reaped
        collect_stale()
        if os.path.islink(self.mnt):
            raise RuntimeError(f"{self.mnt} is a symlink; refusing to mount on it")
        os.makedirs(self.mnt, mode=0o755, exist_ok=True)
        if os.path.dirname(self.mnt) == RUN_DIR:  # ours (not /tmp): the sandbox uid traverses it
            os.chmod(RUN_DIR, 0o755)
        mounts.unshare_mount_namespace()
        mounts.mount("tmpfs", self.mnt, "tmpfs", mounts.MS_NOSUID | mounts.MS_NODEV,
                     f"size={self.limits.workspace_mb}m,mode=0755")
        os.chdir(self.mnt)  # every path below is relative to it (short, neutral mount options)
        if self.image:
            self._boot_image()
        else:
            rootfs.build(self.layout, self.cfg["inside_dir"], self.cfg["root_links"])
            self.overlay.boot()
        size = self.limits.workspace_mb << 20
        # an image's /tmp is everyone's, as in a container (a USER other than root writes there)
        self.tmp_mode = 0o1777 if self.image else 0o755
        self.tmp = TmpfsStack("root/tmp", size, self.uid, mode=self.tmp_mode)
        self.shm = TmpfsStack("root/dev/shm", size, self.uid, mode=self.tmp_mode)
        self.tmp.push()
        self.shm.push()
        if detect():
            self.cg = SandboxCgroup.create(self.limits)
        self.args = self._static_args()
        mounts.drop_bounding_set()
        self.enter_sandbox_uid()
        layers = {"cgroup-" + c: c in (self.cg.dirs if self.cg else {}) for c in
                  ("memory", "pids", "cpu")}
        layers["seccomp"] = self.seccomp is not None
        out = {"workspace": f"{self.mnt}/root{self.inside_ws}", "inside_path": self.inside_ws,
               "layers": layers}
        if self.image:
            layers["root in a user namespace"] = True
            out["owner"] = [self.uid + self.image.get("uid", 0), self.uid + self.image.get("gid", 0)]
        return out

    def _boot_image(self) -> None:
        from posttrain.sandbox import idmap

        nsfd = idmap.user_namespace(self.uid)
        self.extra_fds = (nsfd,)
        os.mkdir("root", 0o755)
        self.iroot = iroot = ImageRoot(self.image, nsfd, self.uid)
        iroot.bind_layers()
        iroot.assemble(self.layout, self.cfg["inside_dir"])
        if self.image.get("workspace"):
            self.overlay = OverlayWorkspace(self.uid, target=f"root{self.image['workspace']}")
            self.overlay.pristine = iroot.workspace_lowers() + ["l/0"]
            self.overlay.boot()
        else:
            self.has_workspace = False

    def enter_sandbox_uid(self) -> None:
        """Real uid/gid := the sandbox's, effective and saved stay 0. The supervisor keeps its
        capabilities (mounts, cgroups), while `posix_spawn(resetids=True)` starts bubblewrap as
        the sandbox uid with no Python in between, and `prlimit` on the sandbox's processes is
        allowed without CAP_SYS_RESOURCE (the kernel checks the caller's real ids)."""
        if os.geteuid() == 0 and self.uid != 0:
            os.setgroups([])
            os.setresgid(self.uid, 0, 0)
            os.setresuid(self.uid, 0, 0)

    def _python(self) -> str:
        lay = self.layout
        return os.path.join(lay["inside_base"], lay["exe"])

    def _static_args(self) -> list[str]:
        """bubblewrap's options, passed on a pipe (`--args FD`) rather than its command line:
        bubblewrap is the sandbox's pid 1, and `/proc/1/cmdline` is readable inside."""
        if self.image:
            return self._image_args()
        lay = self.layout
        path = "/usr/local/bin:/usr/bin:/bin"
        path = ("/opt/venv/bin:" if lay["venv"] else os.path.dirname(self._python()) + ":") + path
        a = ["--unshare-all", "--unshare-user", "--disable-userns",
             "--uid", str(INSIDE_UID), "--gid", str(INSIDE_UID), "--hostname", "sandbox",
             "--die-with-parent", "--new-session", "--cap-drop", "ALL", "--clearenv",
             # the tree `rootfs.py` built; --dev-bind because its /dev holds device nodes
             # (every mount in it is nosuid already, and nodev where nothing needs devices)
             "--dev-bind", f"{self.mnt}/root", "/", "--proc", "/proc", "--chdir", WS]
        env = {"PATH": path, "HOME": "/tmp", "TMPDIR": "/tmp", "LANG": "C.UTF-8",
               "USER": "sandbox", "PYTHONPATH": "/opt/posttrain/inside",
               "PYTHONDONTWRITEBYTECODE": "1", **clock_env(self.cfg.get("clock"))}
        env.update(self._libpath("/opt/python"))
        for k, v in env.items():
            a += ["--setenv", k, v]
        return a

    def _libpath(self, inside_base: str) -> dict[str, str]:
        lay = self.layout
        if lay["libdir"] and lay["libdir"].startswith(lay["base"]) and lay["base"] != "/usr":
            return {"LD_LIBRARY_PATH": inside_base + lay["libdir"][len(lay["base"]):]}
        return {}

    def _image_args(self) -> list[str]:
        """An image sandbox: the user namespace of `_boot_image` (uids 0..65535 inside), the
        image's user, environment and working directory; root keeps Docker's default
        capabilities *inside* that namespace (none on the host: every one is checked against
        the namespace, whose ids are unprivileged host uids)."""
        img = self.image
        uid, gid = img.get("uid", 0), img.get("gid", 0)
        # bubblewrap runs as root inside (the range's first uid: the supervisor may prlimit
        # it); another USER is taken by the job server through setpriv (`server_argv`), which
        # clears the capabilities with the switch
        a = ["--userns", str(self.extra_fds[0]), "--unshare-ipc", "--unshare-pid",
             "--unshare-uts", "--unshare-cgroup",
             "--uid", "0", "--gid", "0", "--hostname", "sandbox",
             "--die-with-parent", "--new-session", "--cap-drop", "ALL", "--clearenv"]
        if img.get("network"):  # an image build's RUN step asked for it (`images/build.py`)
            if img.get("workspace"):
                raise ValueError("the host's network is for image build steps only, never for a "
                                 "sandbox with a workspace (an episode)")
            # the host's network namespace, and its resolver files read-only (not committed:
            # `ImageRoot.commit` drops the mount points bubblewrap may have created for them)
            a += [arg for f in NET_FILES for arg in ("--ro-bind-try", f, f)]
        else:
            a.append("--unshare-net")
        for cap in (ROOT_CAPS if uid == 0 and gid == 0 else ("CAP_SETUID", "CAP_SETGID")):
            a += ["--cap-add", cap]
        a += ["--dev-bind", f"{self.mnt}/root", "/", "--proc", "/proc",
              "--chdir", self.inside_ws]
        env = {"PATH": DOCKER_PATH, "HOME": img.get("home") or ("/root" if uid == 0 else "/"),
               "LANG": "C.UTF-8", **clock_env(self.cfg.get("clock")), **img.get("env", {})}
        env.update(self._libpath("/opt/posttrain/python"))
        for k, v in env.items():
            a += ["--setenv", k, v]
        return a

    # -- processes -----------------------------------------------------------------------
    def spawn(self, argv: list[str], *, stdin: int, stdout: int, stderr: int,
              pass_fds: tuple[int, ...] = ()) -> BwrapHandle:
        """Start `argv` in a new bubblewrap sandbox, inside the cgroup and under the rlimits.

        The cheap way (no Python between fork and exec, which costs ~10 ms on a busy machine):
        `posix_spawn` (vfork) with POSIX_SPAWN_RESETIDS drops to the sandbox uid (the supervisor
        runs with real uid = that uid and effective uid 0, see `enter_sandbox_uid`); bubblewrap
        reports its pid 1 on --info-fd and waits on --block-fd before it forks the command, so
        the supervisor puts that pid into the cgroup and `prlimit`s it (allowed: same real uid)
        first. Nothing of the command runs outside the cgroup or without its rlimits.
        """
        opts = list(self.args)
        ours: list[int] = []  # descriptors of the child's to close here once it has them
        info_r, info_w = os.pipe2(os.O_CLOEXEC)
        block_r, block_w = os.pipe2(os.O_CLOEXEC)
        ours += [info_w, block_r]
        opts += ["--info-fd", str(info_w), "--block-fd", str(block_r)]
        if self.seccomp is not None:
            ours.append(_pipe_with(self.seccomp))  # a few hundred bytes: fit in a pipe buffer
            opts += ["--seccomp", str(ours[-1])]
        ours.append(_pipe_with(b"".join(a.encode() + b"\0" for a in opts)))
        full = [self.cfg["bwrap"], "--args", str(ours[-1]), "--", *argv]
        pass_fds = tuple(pass_fds) + self.extra_fds
        try:
            for fd in ours + list(pass_fds):
                os.set_inheritable(fd, True)  # posix_spawn passes exactly the inheritable fds
            # bubblewrap starts inside the sandbox's cgroup, so that its cgroup namespace is
            # rooted there: /proc/self/cgroup then reads "/" inside, not the host's hierarchy
            with (self.cg.joined() if self.cg else contextlib.nullcontext()):
                pid = os.posix_spawn(
                    self.cfg["bwrap"], full, {},
                    file_actions=[(os.POSIX_SPAWN_DUP2, stdin, 0),
                                  (os.POSIX_SPAWN_DUP2, stdout, 1),
                                  (os.POSIX_SPAWN_DUP2, stderr, 2)],
                    resetids=os.getuid() != os.geteuid(), setsigmask=(),
                    setsigdef=(signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT, signal.SIGTERM))
        finally:
            for fd in pass_fds:
                os.set_inheritable(fd, False)
            for fd in ours:
                os.close(fd)
        handle = BwrapHandle(pid)
        try:
            init_pid = _read_child_pid(info_r)
            if init_pid is None:
                raise SpawnError("bubblewrap exited before it created the sandbox")
            handle.init_pid = init_pid
            self.init_pid = init_pid
            if self.cg is not None:
                self.cg.add(init_pid)
            for res, value in self.rlimits.items():
                resource.prlimit(init_pid, res, value)
            os.write(block_w, b"x")
        except BaseException:
            handle.kill()
            os.waitpid(pid, 0)
            handle.close()
            raise
        finally:
            os.close(info_r)
            os.close(block_w)
        return handle

    def server_argv(self, fd: int, started_fd: int, preload: list[str]) -> list[str]:
        python = "/opt/venv/bin/python3" if self.layout["venv"] else self._python()
        if self.image:  # the image's own python3 may be another one, or none
            python = ("/opt/posttrain/venv/bin/python3" if self.layout["venv"] else
                      os.path.join("/opt/posttrain/python", self.layout["exe"]))
            uid, gid = self.image.get("uid", 0), self.image.get("gid", 0)
            if uid or gid:
                return ["/usr/bin/setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups",
                        "--", python, "/opt/posttrain/inside/_forkserver.py", str(fd),
                        str(started_fd), ",".join(preload)]
        return [python, "/opt/posttrain/inside/_forkserver.py", str(fd), str(started_fd),
                ",".join(preload)]

    def server_ready(self, handle: BwrapHandle) -> None:
        """Learn the server's host pid: the only child of bubblewrap's pid 1 at this point."""
        self.infra = set()
        try:
            with open(f"/proc/{handle.init_pid}/task/{handle.init_pid}/children") as f:
                children = [int(x) for x in f.read().split()]
        except (OSError, ValueError):
            return
        if len(children) == 1:
            self.infra = {p for p in (handle.pid, handle.init_pid, children[0]) if p is not None}
            self.server_pid = children[0]

    # -- the sandbox's processes, seen from the host -----------------------------------------
    def _processes(self) -> set[int]:
        """Host pids of every process of the sandbox but the job server and its bubblewrap: the
        cgroup's members, or (without cgroups) the processes of the sandbox's host uid."""
        if self.cg is not None:
            return self.cg.pids() - self.infra
        own = {os.getpid()}  # the supervisor has the sandbox's real uid too
        return {pid for pid, _ in _uid_processes(self.uid)} - self.infra - own

    def _is_ours(self, pid: int) -> bool:
        try:
            if self.cg is not None:
                with open(f"/proc/{pid}/cgroup") as f:
                    return self.cg.name in f.read()
            with open(f"/proc/{pid}/status") as f:
                uid_line = next(line for line in f if line.startswith("Uid:"))
            return int(uid_line.split()[1]) == self.uid
        except (OSError, StopIteration, ValueError):
            return False

    def _kill_until_gone(self, select_victims) -> int | None:
        """SIGKILL what `select_victims()` returns until it returns nothing (a fork bomb refills
        while we kill; the pids limit caps it). The number killed, or None if it does not
        settle. Each pid is pinned with a pidfd and checked to still be the sandbox's before
        the signal, so a pid recycled by a host process since the listing is never hit."""
        killed: set[int] = set()
        for _ in range(500):
            victims = select_victims()
            if not victims:
                return len(killed)
            for pid in victims:
                try:
                    pidfd = os.pidfd_open(pid)
                except OSError:
                    continue
                try:
                    if self._is_ours(pid):
                        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                        killed.add(pid)
                except OSError:
                    pass
                finally:
                    os.close(pidfd)
            time.sleep(0.001)
        return None

    def kill_job(self, handle: BwrapHandle | None, job_pid: int | None) -> bool:
        """Kill the running job's session (the job called setsid: its session is the job and
        the children it did not detach). `job_pid` is its pid inside the sandbox. False if it
        cannot be told apart from the rest: then the caller kills the whole sandbox."""
        if job_pid is None or not self.infra:
            return False

        def session() -> set[int]:
            return {pid for pid in self._processes() if job_pid in _ns_ids(pid)}

        return self._kill_until_gone(session) is not None

    def kill_processes(self, handle: BwrapHandle | None) -> int | None:
        """Kill everything but the job server and an image's service (its session: part of
        the environment, as in a container); None if the server cannot be told apart."""
        if not self.infra:
            return None

        def victims() -> set[int]:
            found = self._processes()
            if self.service_sids:
                found = {p for p in found if _ns_ids(p)[1] not in self.service_sids}
            return found

        return self._kill_until_gone(victims)

    def counters(self) -> dict[str, int]:
        return self.cg.counters() if self.cg else {}

    def reset_peak(self) -> None:
        if self.cg:
            self.cg.reset_peak()

    def peak_mb(self) -> float | None:
        return self.cg.peak_mb() if self.cg else None

    # -- snapshots (overlay.py) ----------------------------------------------------------
    @property
    def snapshots(self) -> dict[str, list[str]]:
        return self.overlay.snapshots

    def snapshot(self) -> str:
        if not self.has_workspace:
            raise ValueError("an image build sandbox has no workspace to snapshot")
        return self.overlay.snapshot(live=bool(self._processes()))

    def restore(self, sid: str) -> None:
        self.overlay.restore(sid)

    # -- reset between episodes (`reset.py` decides from what this finds) -------------------
    def reset(self, server: BwrapHandle | None) -> ResetFacts:
        if server is None or not self.infra or self.init_pid is None:
            return ResetFacts(killed=0, server="not running (killed during the episode?)")
        killed = self._kill_until_gone(self._processes)
        left = tuple(sorted(self._processes()))
        state = _server_state(self.server_pid)
        if killed is None or left or state != "ok":
            return ResetFacts(killed=killed, server=state, processes_left=left)
        try:
            self.overlay.reset()
            self.tmp.reset()
            self.shm.reset()
        except OSError as e:
            return ResetFacts(killed=killed, restore_error=str(e))
        try:
            ipc_left = ipc.clear(self.init_pid)
            places = self._probe(self.init_pid)
        except OSError as e:
            return ResetFacts(killed=killed, restore_error=f"probe: {e}")
        return ResetFacts(killed=killed, places=places, ipc_left=ipc_left)

    def reset_image(self, start_server) -> ResetFacts:
        """An image sandbox between episodes: its root changed too, so everything is killed
        (the job server included: the caller stopped it), the whole tree is mounted afresh over
        the same layers with empty uppers, and `start_server()` (-> its handle) starts a job
        server in the new tree. The probe then checks /tmp and /dev/shm as for a plain one."""
        self.infra = set()
        self.service_sids = set()
        killed = self._kill_until_gone(self._processes)
        left = tuple(sorted(self._processes()))
        if killed is None or left:
            return ResetFacts(killed=killed, processes_left=left)
        assert self.iroot is not None
        try:
            self.iroot.teardown()
            self.iroot.assemble(self.layout, self.cfg["inside_dir"])
            if self.has_workspace:
                self.overlay.depth = 0  # its mounts went with the tree
                self.overlay.reset()
            for place in (self.tmp, self.shm):
                place.depth = 0
                place.push()
            handle = start_server()
        except OSError as e:
            return ResetFacts(killed=killed, restore_error=str(e))
        try:
            places = self._probe(handle.init_pid, ("/tmp", "/dev/shm"))
        except OSError as e:
            return ResetFacts(killed=killed, restore_error=f"probe: {e}")
        return ResetFacts(killed=killed, places=places)

    def commit(self, dest: str) -> None:
        """A build step's result as a new layer at `dest` (see `ImageRoot.commit`)."""
        if self.iroot is None or self.has_workspace:
            raise ValueError("only an image build sandbox (no workspace) can commit a layer")
        self.iroot.commit(dest)

    def _probe(self, init_pid: int, where_all=WRITABLE) -> tuple[PlaceState, ...]:
        """The writable places as the next episode will see them: through the sandbox's own
        root and mount table (`/proc/PID/root`, `/proc/PID/mountinfo`), not through ours."""
        with open(f"/proc/{init_pid}/mountinfo") as f:
            table = f.read()
        out = []
        for path in where_all:
            where = f"/proc/{init_pid}/root{path}"
            st = os.stat(where)
            out.append(PlaceState(path, tuple(os.listdir(where)), st.st_uid == self.uid,
                                  stat.S_IMODE(st.st_mode), count_mounts(table, path),
                                  expected_mode=self.tmp_mode))
        return tuple(out)

    def idle(self) -> None:
        """Work done after a reply was sent: free discarded layers, reap orphans."""
        self.overlay.collect_trash()
        if self.iroot is not None:
            while self.iroot.trash:
                shutil.rmtree(self.iroot.trash.pop(), ignore_errors=True)
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break

    def shutdown(self) -> bool:
        clean = False
        if self.cg is not None:
            self.cg.kill_all()
            clean = "pids" in self.cg.dirs and not self.cg.pids()
            self.cg.destroy()
        # as a subreaper we inherited every orphan: reap them all, so that no zombie of this
        # sandbox is left to the host's init (zombies count against the uid's RLIMIT_NPROC)
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                time.sleep(0.002)
        return clean
