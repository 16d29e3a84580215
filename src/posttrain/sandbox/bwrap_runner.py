"""Supervisor-side half of the bubblewrap backend (see `bwrap.py` for the design and the
layers). Runs as root in the supervisor's private mount namespace: boots the sandbox's mounts
and cgroup, spawns bubblewrap (with the options of `bwrap_args.py`), kills what runs inside
(`bwrap_procs.py`) and resets it between episodes."""

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

from posttrain.sandbox import bwrap_args, ipc, mounts, rootfs
from posttrain.sandbox.base import Limits
from posttrain.sandbox.bwrap import PR_SET_CHILD_SUBREAPER, RUN_DIR, WS
from posttrain.sandbox.bwrap_procs import SandboxProcesses, server_state
from posttrain.sandbox.cgroups import SandboxCgroup, collect_stale, detect
from posttrain.sandbox.imageroot import ImageRoot
from posttrain.sandbox.overlay import OverlayWorkspace, TmpfsStack
from posttrain.sandbox.reset import PRISTINE_MODE, WRITABLE, PlaceState, ResetFacts, count_mounts
from posttrain.sandbox.rlimits import rlimit_table


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
        self.candidate_uid: int | None = None if self.image else cfg.get("candidate_uid")
        """a two-uid sandbox's second host uid (its candidates', `bwrap_args.plain_args`)"""
        self.procs = SandboxProcesses((self.uid,) if self.candidate_uid is None
                                      else (self.uid, self.candidate_uid))
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
            if self.candidate_uid is not None:
                self._boot_two_uids()
            rootfs.build(self.layout, self.cfg["inside_dir"], self.cfg["root_links"])
            self.overlay.boot()
        size = self.limits.workspace_mb << 20
        # an image's /tmp is everyone's, as in a container (a USER other than root writes
        # there), and so is a two-uid sandbox's (the candidate uid writes there too)
        self.tmp_mode = 0o1777 if self.image or self.candidate_uid is not None else 0o755
        self.tmp = TmpfsStack("root/tmp", size, self.uid, mode=self.tmp_mode)
        self.shm = TmpfsStack("root/dev/shm", size, self.uid, mode=self.tmp_mode)
        self.tmp.push()
        self.shm.push()
        if detect():
            self.cg = SandboxCgroup.create(self.limits)
        self.procs.cg = self.cg
        self.args = self._static_args()
        mounts.drop_bounding_set()
        self.enter_sandbox_uid()
        layers = {"cgroup-" + c: c in (self.cg.dirs if self.cg else {}) for c in
                  ("memory", "pids", "cpu")}
        layers["seccomp"] = self.seccomp is not None
        out = {"workspace": f"{self.mnt}/root{self.inside_ws}", "inside_path": self.inside_ws,
               "layers": layers}
        if self.candidate_uid is not None:
            layers["two uids"] = True
        if self.image:
            layers["root in a user namespace"] = True
            out["owner"] = [self.uid + self.image.get("uid", 0), self.uid + self.image.get("gid", 0)]
        return out

    def _boot_two_uids(self) -> None:
        """The user namespace of a two-uid sandbox: uid 1000 is the sandbox's host uid (the
        namespace's owner, as bubblewrap's own namespace would map it), 1001 the second one.
        Only a privileged writer may map a uid other than its own: made here, while root."""
        from posttrain.sandbox import idmap
        from posttrain.sandbox.bwrap import CANDIDATE_UID, INSIDE_UID

        assert self.candidate_uid is not None
        self.extra_fds = (idmap.user_namespace(self.uid, mapping=[
            (INSIDE_UID, self.uid, 1), (CANDIDATE_UID, self.candidate_uid, 1)]),)

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

    def _static_args(self) -> list[str]:
        """bubblewrap's options (`bwrap_args.py`), passed on a pipe (`--args FD`) rather than its
        command line: bubblewrap is the sandbox's pid 1, and `/proc/1/cmdline` is readable inside."""
        clock = self.cfg.get("clock")
        if self.image:
            return bwrap_args.image_args(self.image, self.layout, self.mnt, self.inside_ws,
                                         self.extra_fds[0], clock)
        return bwrap_args.plain_args(self.layout, self.mnt, clock,
                                     self.extra_fds[0] if self.extra_fds else None, self.limits.cpus)

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
        return bwrap_args.server_argv(self.layout, self.image, fd, started_fd, preload)

    def server_ready(self, handle: BwrapHandle) -> None:
        """Learn the server's host pid: the sandbox's pid 1 itself (`bwrap_args.AS_INIT`)."""
        self.procs.infra = set()
        if handle.init_pid is not None:
            self.procs.infra = {p for p in (handle.pid, handle.init_pid) if p is not None}
            self.server_pid = handle.init_pid

    # -- the sandbox's processes, seen from the host (`bwrap_procs.py`) -----------------------
    def kill_job(self, handle: BwrapHandle | None, job_pid: int | None) -> bool:
        """Kill the running job's session (the job called setsid: its session is the job and
        the children it did not detach). `job_pid` is its pid inside the sandbox. False if it
        cannot be told apart from the rest: then the caller kills the whole sandbox."""
        if job_pid is None or not self.procs.infra:
            return False
        return self.procs.kill_session(job_pid)

    def kill_processes(self, handle: BwrapHandle | None) -> int | None:
        """Kill everything but the job server and an image's service (its session: part of
        the environment, as in a container); None if the server cannot be told apart."""
        if not self.procs.infra:
            return None
        return self.procs.kill_all_but(self.service_sids)

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
        return self.overlay.snapshot(live=bool(self.procs.listed()))

    def restore(self, sid: str) -> None:
        self.overlay.restore(sid)

    # -- reset between episodes (`reset.py` decides from what this finds) -------------------
    def reset(self, server: BwrapHandle | None, start_server=None) -> ResetFacts:
        """`server`: the running job server (spared); None when the episode killed it: then
        `start_server()` (-> its handle), if given, starts a new one once everything else is
        killed and the writable places are remounted, and the probe looks through it."""
        if server is None and start_server is not None and self.init_pid is not None:
            return self._reset_without_server(start_server)
        if server is None or not self.procs.infra or self.init_pid is None:
            return ResetFacts(killed=0, server="not running (killed during the episode?)")
        killed = self.procs.kill_until_gone(self.procs.listed)
        left = tuple(sorted(self.procs.listed()))
        state = server_state(self.server_pid)
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

    def _reset_without_server(self, start_server) -> ResetFacts:
        self.procs.infra = set()  # the dead server's pids: nothing is spared now
        killed = self.procs.kill_until_gone(self.procs.listed)
        left = tuple(sorted(self.procs.listed()))
        if killed is None or left:
            return ResetFacts(killed=killed, processes_left=left)
        try:
            self.overlay.reset()
            self.tmp.reset()
            self.shm.reset()
            handle = start_server()
        except (OSError, RuntimeError) as e:  # RuntimeError: the new job server did not start
            return ResetFacts(killed=killed, restore_error=f"{type(e).__name__}: {e}")
        state = server_state(self.server_pid)
        if state != "ok":
            return ResetFacts(killed=killed, server=state)
        try:  # each job server has an IPC namespace of its own: the old one died with it
            ipc_left = ipc.clear(handle.init_pid)
            places = self._probe(handle.init_pid)
        except OSError as e:
            return ResetFacts(killed=killed, restore_error=f"probe: {e}")
        return ResetFacts(killed=killed, places=places, ipc_left=ipc_left)

    def reset_image(self, start_server) -> ResetFacts:
        """An image sandbox between episodes: its root changed too, so everything is killed
        (the job server included: the caller stopped it), the whole tree is mounted afresh over
        the same layers with empty uppers, and `start_server()` (-> its handle) starts a job
        server in the new tree. The probe then checks /tmp and /dev/shm as for a plain one."""
        self.procs.infra = set()
        self.service_sids = set()
        killed = self.procs.kill_until_gone(self.procs.listed)
        left = tuple(sorted(self.procs.listed()))
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
                                  expected_mode=PRISTINE_MODE if path == WS else self.tmp_mode))
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
