"""The processes of one bubblewrap sandbox, seen from the host: find them, and kill them.

A sandbox's processes are its cgroup's members or, where there are no cgroups, the live
processes of its host uids. The job server and its bubblewrap (`infra`) are not a job's to
lose and are never listed. Every kill pins the pid with a pidfd and checks that it still is
the sandbox's before the signal, so a pid recycled by a host process is never hit."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator

from posttrain.sandbox.cgroups import SandboxCgroup


def uid_processes(uid: int) -> Iterator[tuple[int, dict[str, str]]]:
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


def ns_ids(pid: int) -> tuple[int, int]:
    """(pid, session id) of a process as seen in its own (innermost) pid namespace."""
    try:
        with open(f"/proc/{pid}/status") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        return int(fields["NSpid"].split()[-1]), int(fields["NSsid"].split()[-1])
    except (OSError, KeyError, ValueError, IndexError):
        return (-1, -1)


def server_state(pid: int | None) -> str:
    """"ok" if the job server is running or waiting (not stopped, traced or dying)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError, TypeError):
        return "gone"
    return "ok" if state in ("R", "S") else f"in state {state!r}"


class SandboxProcesses:
    """Finds and kills the processes of one sandbox (see the module docstring)."""

    def __init__(self, uids: tuple[int, ...]) -> None:
        self.uids = uids
        """the sandbox's host uids (used where there is no cgroup)"""
        self.cg: SandboxCgroup | None = None
        self.infra: set[int] = set()
        """host pids of the server's bubblewrap and the server: not the job's to lose"""

    def listed(self) -> set[int]:
        """Host pids of every process of the sandbox but the job server and its bubblewrap: the
        cgroup's members, or (without cgroups) the processes of the sandbox's host uids."""
        if self.cg is not None:
            return self.cg.pids() - self.infra
        own = {os.getpid()}  # the supervisor has the sandbox's real uid too
        return {pid for uid in self.uids for pid, _ in uid_processes(uid)} - self.infra - own

    def is_ours(self, pid: int) -> bool:
        try:
            if self.cg is not None:
                with open(f"/proc/{pid}/cgroup") as f:
                    return self.cg.name in f.read()
            with open(f"/proc/{pid}/status") as f:
                uid_line = next(line for line in f if line.startswith("Uid:"))
            return int(uid_line.split()[1]) in self.uids
        except (OSError, StopIteration, ValueError):
            return False

    def kill_until_gone(self, select_victims: Callable[[], set[int]]) -> int | None:
        """SIGKILL what `select_victims()` returns until it returns nothing (a fork bomb refills
        while we kill; the pids limit caps it). The number killed, or None if it does not
        settle."""
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
                    if self.is_ours(pid):
                        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                        killed.add(pid)
                except OSError:
                    pass
                finally:
                    os.close(pidfd)
            time.sleep(0.001)
        return None

    def kill_session(self, job_pid: int) -> bool:
        """Kill the session of `job_pid` (a pid as seen inside); False if it does not settle."""
        def session() -> set[int]:
            return {pid for pid in self.listed() if job_pid in ns_ids(pid)}

        return self.kill_until_gone(session) is not None

    def kill_all_but(self, service_sids: set[int]) -> int | None:
        """Kill everything but the server and the sessions `service_sids` (as seen inside)."""
        def victims() -> set[int]:
            found = self.listed()
            if service_sids:
                found = {p for p in found if ns_ids(p)[1] not in service_sids}
            return found

        return self.kill_until_gone(victims)
