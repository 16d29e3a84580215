"""What a sandbox shows of its host through /proc (nothing), and its fixed, recorded clock."""

from __future__ import annotations

import os
import re
import shutil
import sys

import pytest

import posttrain
from posttrain.sandbox import Limits, SandboxPool, open_sandbox
from posttrain.sandbox.base import DEFAULT_CLOCK
from posttrain.sandbox.bwrap import MOUNTPOINT, bwrap_problem

PROBLEM = bwrap_problem()
needs_bwrap = pytest.mark.skipif(PROBLEM is not None, reason=f"bubblewrap unavailable: {PROBLEM}")

FILES = ("/proc/self/mountinfo", "/proc/mounts", "/proc/self/cgroup", "/proc/1/cmdline",
         "/proc/self/cmdline", "/proc/self/environ", "/proc/self/status", "/proc/1/status",
         "/proc/self/uid_map", "/proc/self/gid_map")


def _host_paths() -> set[str]:
    paths = {os.path.realpath(sys.prefix), os.path.realpath(sys.base_prefix),
             os.path.dirname(os.path.dirname(os.path.realpath(posttrain.__file__))),
             os.path.realpath(os.getcwd()), MOUNTPOINT, "/newroot", "oldroot"}
    return {p for p in paths if p not in ("/", "/usr")}


@needs_bwrap
def test_proc_shows_no_host_path_uid_or_pid():
    with open_sandbox(Limits(wall_s=10), backend="bwrap") as sb:
        dump = {}
        for path in FILES:
            r = sb.run(["cat", path])
            assert r.ok, (path, r)
            dump[path] = r.stdout.replace("\0", " ")
        host_uid = str(sb.host_uid)
        host_pids = {str(os.getpid()), str(sb._sup_pid)}
        for path, text in dump.items():
            for host in _host_paths():
                assert host not in text, f"{path} shows the host path {host}:\n{text}"
            assert not re.search(rf"\b{host_uid}\b", text), f"{path} shows the host uid:\n{text}"
            assert "posttrain-sandbox" not in text, f"{path} names the host cgroup:\n{text}"
        for path in ("/proc/self/cgroup", "/proc/1/cmdline", "/proc/self/environ"):
            for pid in host_pids:
                assert not re.search(rf"\b{pid}\b", dump[path]), f"{path} shows host pid {pid}"
        # the cgroup namespace is rooted at the sandbox's own cgroup
        assert all(line.endswith(":/") for line in dump["/proc/self/cgroup"].splitlines())
        # pid 1 is the job server (no bubblewrap above it): no bind sources on a command line
        assert dump["/proc/1/cmdline"].split()[1] == "/opt/posttrain/inside/_forkserver.py"
        assert "--bind" not in dump["/proc/1/cmdline"] and "--bind" not in dump["/proc/self/cmdline"]
        for line in dump["/proc/self/status"].splitlines():
            if line.startswith(("Uid:", "Gid:")):
                assert set(line.split()[1:]) == {"1000"}, line
        # what the sandbox needs still works: a pty, the interpreter, /dev/null
        r = sb.run_python("import os; m, s = os.openpty(); print(os.ttyname(s)); "
                          "open('/dev/null', 'w').write('x')")
        assert r.ok and r.stdout.startswith("/dev/pts/"), r


def _git_head(sb) -> str:
    r = sb.run("git init -q -b main && echo hello > a.txt && git add a.txt && "
               "git -c user.name=A -c user.email=a@example.com commit -q -m first && "
               "git rev-parse HEAD && git log -1 --format=%ad --date=unix")
    assert r.ok, r
    return r.stdout


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
@needs_bwrap
def test_fixed_clock_makes_git_hashes_reproduce():
    with open_sandbox(Limits(wall_s=20), backend="bwrap") as a, \
            open_sandbox(Limits(wall_s=20), backend="bwrap") as b:
        first = _git_head(a)
        assert first.split()[1] == str(DEFAULT_CLOCK)
        assert a.info.clock == DEFAULT_CLOCK  # recorded with the episode (SandboxInfo)
        assert _git_head(b) == first  # another sandbox: the same commit
        assert a.reset().reusable
        assert _git_head(a) == first  # the same sandbox after a reset: the same commit
    with open_sandbox(Limits(wall_s=20), backend="bwrap", clock=DEFAULT_CLOCK + 60) as c:
        other = _git_head(c)
        assert other != first and other.split()[1] == str(DEFAULT_CLOCK + 60)
    with open_sandbox(Limits(wall_s=20), backend="bwrap", clock=None) as d:
        assert d.run("echo ${SOURCE_DATE_EPOCH:-unset}").stdout == "unset\n"
        assert d.info.clock is None


def test_bad_clock_is_refused():
    with pytest.raises(ValueError, match="clock"):
        open_sandbox(clock=-1)
    with pytest.raises(ValueError, match="clock"):
        SandboxPool(size=1, clock="yesterday")
