"""Behaviour of the public sandbox API, on both backends (bubblewrap and the opt-in process
backend): commands, limits as data, the file API and its escape checks, snapshots, archives,
the warm path, bad input, broken sandboxes."""

from __future__ import annotations

import io
import os
import signal
import tarfile
import time

import pytest

from posttrain.sandbox import (
    LimitReason,
    Limits,
    RunResult,
    Sandbox,
    SandboxBroken,
    SandboxError,
    SandboxUnavailable,
    WorkspacePathError,
    open_sandbox,
)
from posttrain.sandbox.bwrap import bwrap_problem
from posttrain.sandbox.factory import check_available

BWRAP_PROBLEM = bwrap_problem()
needs_bwrap = pytest.mark.skipif(BWRAP_PROBLEM is not None,
                                 reason=f"bubblewrap unavailable: {BWRAP_PROBLEM}")
LIMITS = Limits(wall_s=5, cpu_s=5, memory_mb=512, output_bytes=4096, output_kill_bytes=1 << 16)


def _open(backend: str, limits: Limits = LIMITS):
    if backend == "process":
        with pytest.warns(RuntimeWarning, match="WITHOUT a sandbox"):
            return open_sandbox(limits, backend="process", allow_unsandboxed=True)
    return open_sandbox(limits, backend="bwrap")


BACKENDS = [pytest.param("bwrap", marks=needs_bwrap), "process"]


@pytest.fixture(scope="module", params=BACKENDS)
def sb(request):
    box = _open(request.param)
    yield box
    box.close()


def test_run_shell_string_and_argv(sb):
    assert isinstance(sb, Sandbox) and sb.info.backend in ("bwrap", "process") and sb.info.image
    r = sb.run("echo out; echo err >&2; exit 3")
    assert isinstance(r, RunResult)
    assert (r.exit_code, r.stdout, r.stderr, r.limit, r.ok) == (3, "out\n", "err\n", None, False)
    r = sb.run(["python3", "-c", "import os, sys; print(os.getcwd()); sys.exit(0)"])
    assert r.ok and r.stdout.strip() == sb.workspace_path
    assert r.wall_s > 0 and r.cpu_s >= 0


def test_stdin_env_and_missing_binary(sb):
    assert sb.run(["cat"], stdin="hello").stdout == "hello"
    assert sb.run("echo $FOO", env={"FOO": "bar"}).stdout == "bar\n"
    r = sb.run(["definitely-not-a-command"])
    assert r.exit_code == 127 and "not" in r.stderr


def test_timeout_is_data(sb):
    r = sb.run("sleep 30", timeout=0.5)
    assert r.limit is LimitReason.TIMEOUT and r.exit_code is None and r.wall_s < 5
    assert sb.run("echo next").stdout == "next\n"  # the sandbox carries on


def test_output_truncated_then_killed(sb):
    r = sb.run("head -c 10000 /dev/zero | tr '\\0' x")
    assert r.ok and r.stdout_truncated and len(r.stdout) == 4096
    r = sb.run("yes")
    assert r.limit is LimitReason.OUTPUT and r.stdout_truncated and len(r.stdout) == 4096


def test_file_api_roundtrip(sb):
    sb.write_file("pkg/sub/a.txt", "alpha")
    sb.write_file("b.bin", b"\x00\x01", mode=0o600)
    assert sb.read_file("pkg/sub/a.txt") == b"alpha"
    assert sb.read_file("./b.bin") == b"\x00\x01"
    assert {"pkg/sub/a.txt", "b.bin"} <= set(sb.list_files())
    assert sb.list_files("pkg") == ["pkg/sub/a.txt"]
    assert sb.run("cat pkg/sub/a.txt").stdout == "alpha"
    sb.run("echo from-inside > made.txt")
    assert sb.read_file("made.txt") == b"from-inside\n"
    with pytest.raises(FileNotFoundError):
        sb.read_file("nope.txt")


@pytest.mark.parametrize("bad", ["/etc/passwd", "../x", "a/../../x", "", "a\0b"])
def test_file_api_refuses_bad_paths(sb, bad):
    with pytest.raises(WorkspacePathError):
        sb.read_file(bad)
    with pytest.raises(WorkspacePathError):
        sb.write_file(bad, "x")


def test_file_api_symlinks(sb):
    sb.write_file("target.txt", "inside")
    ws = sb.workspace_path
    assert sb.run(f"ln -sf target.txt rel && ln -sf {ws}/target.txt abs && ln -sfn / root "
                  "&& ln -sf /etc/passwd pw && ln -sf ../../../../etc/passwd up").ok
    assert sb.read_file("rel") == b"inside" and sb.read_file("abs") == b"inside"
    for link in ("root/etc/passwd", "pw", "up"):
        with pytest.raises(WorkspacePathError):
            sb.read_file(link)
        with pytest.raises(WorkspacePathError):
            sb.write_file(link, "overwritten")
    assert "rel" not in sb.list_files()  # only regular files are listed


def test_snapshot_restore_copy_on_write(sb):
    sb.write_file("state.txt", "v1")
    s1 = sb.snapshot()
    sb.write_file("state.txt", "v2")
    sb.write_file("new.txt", "n")
    s2 = sb.snapshot()
    sb.run("echo v3 > state.txt; rm new.txt")
    sb.restore(s1)
    assert sb.read_file("state.txt") == b"v1" and "new.txt" not in sb.list_files()
    assert sb.run("cat state.txt").stdout == "v1"
    sb.write_file("state.txt", "v1-changed")  # writes after a restore do not touch s1
    sb.restore(s2)
    assert sb.read_file("state.txt") == b"v2" and sb.read_file("new.txt") == b"n"
    sb.restore(s1)
    assert sb.read_file("state.txt") == b"v1"
    assert sb.run_python("print(open('state.txt').read())").stdout == "v1\n"
    with pytest.raises(ValueError):
        sb.restore("snap-999")


def test_background_processes_persist_until_killed(sb):
    r = sb.run("(sleep 30 > /dev/null 2>&1 &); echo started")  # an agent's `server &`
    assert r.stdout == "started\n" and r.wall_s < 5
    count = "import os; print(sum(1 for p in os.listdir('/proc') if p.isdigit() and " \
            "open(f'/proc/{p}/cmdline', 'rb').read().startswith(b'sleep')))"
    if sb.info.backend == "bwrap":  # the process backend has no private /proc to look into
        assert sb.run(["python3", "-c", count]).stdout == "1\n"
    assert sb.kill_processes() >= 1
    assert sb.kill_processes() == 0
    if sb.info.backend == "bwrap":
        assert sb.run(["python3", "-c", count]).stdout == "0\n"
    assert sb.run("echo usable").stdout == "usable\n"


def test_snapshot_while_a_background_writer_runs(sb):
    sb.write_file("log.txt", "")
    sb.run("(while true; do echo tick >> log.txt; sleep 0.05; done > /dev/null 2>&1 &)")
    time.sleep(0.3)
    before = sb.read_file("log.txt")
    sid = sb.snapshot()  # the writer keeps running through the snapshot...
    after = sb.read_file("log.txt")
    time.sleep(0.3)
    assert len(sb.read_file("log.txt")) > len(after)  # ...and after it
    sb.restore(sid)  # kills the writer and brings back the snapshot
    restored = sb.read_file("log.txt")
    assert len(before) <= len(restored) <= len(after) and after.startswith(restored)
    frozen = sb.archive()
    time.sleep(0.2)
    assert sb.archive() == frozen  # nothing writes any more


def test_archive_is_deterministic(sb):
    sb.write_file("arch/x.txt", "x")
    a, b = sb.archive(), sb.archive()
    assert a == b
    names = tarfile.open(fileobj=io.BytesIO(a)).getnames()
    assert names.index("arch") < names.index("arch/x.txt")
    sb.write_file("arch/x.txt", "y")
    assert sb.archive() != a


def test_run_python_warm_path(sb):
    r = sb.run_python("import sys; print(sys.argv[1:]); print(input())", args=["a", "b"],
                      stdin="line\n")
    assert r.ok and r.stdout == "['a', 'b']\nline\n"
    r = sb.run_python("raise SystemExit(4)")
    assert r.exit_code == 4
    r = sb.run_python("1/0")
    assert r.exit_code == 1 and "ZeroDivisionError" in r.stderr
    r = sb.run_python("import time; time.sleep(30)", timeout=0.5)
    assert r.limit is LimitReason.TIMEOUT
    assert sb.run_python("print('after')").stdout == "after\n"


@pytest.mark.slow
def test_project_interpreter_and_helpers_inside(sb):
    modules = "numpy, trimesh" if sb.info.backend == "bwrap" else "numpy"
    r = sb.run(["python", "-c", f"import sys, {modules}, _forkserver; print(sys.prefix)"],
               timeout=120)  # a cold import of trimesh on a busy machine takes seconds
    assert r.ok, r
    r = sb.run(["python3", "-c", "import posttrain"])
    if sb.info.backend == "bwrap":  # only the helper directory is exposed, not the package
        assert r.exit_code == 1 and "ModuleNotFoundError" in r.stderr


@pytest.mark.parametrize("limits,command,reason", [
    (Limits(wall_s=20, cpu_s=1), ["python3", "-c", "while True: pass"], LimitReason.CPU),
    (Limits(wall_s=10, file_mb=1), ["dd", "if=/dev/zero", "of=big", "bs=1M", "count=5"],
     LimitReason.FILESIZE),
    (Limits(wall_s=10, pids=12), "for i in $(seq 40); do sleep 3 & done; wait", LimitReason.PIDS),
    (Limits(wall_s=10, memory_mb=64),
     ["python3", "-c", "b = [b'x' * (8 << 20) for _ in range(99)]"], LimitReason.MEMORY),
], ids=["cpu", "filesize", "pids", "memory"])
@pytest.mark.slow
@needs_bwrap
def test_limit_reasons(limits, command, reason):
    with open_sandbox(limits, backend="bwrap") as box:
        r = box.run(command)
        assert r.limit is reason and r.exit_code is None and not r.ok, r
        assert box.run("echo fine").stdout == "fine\n"


def test_unknown_preload_is_rejected():
    with pytest.raises(ValueError, match="no_such_module_xyz"):
        open_sandbox(preload=("no_such_module_xyz",))


def test_a_module_file_is_shown_inside_and_bad_ones_are_rejected(tmp_path):
    api = tmp_path / "toyapi.py"
    api.write_text("def twice(x):\n    raise ValueError(f'no {x}')\n")
    with open_sandbox(preload=(str(api),)) as sb:
        assert sb.info.modules == (str(api),)
        r = sb.run_python("import toyapi; toyapi.twice(3)")
        assert r.exit_code == 1 and "ValueError: no 3" in r.stderr
        if sb.info.backend == "bwrap":  # the path tracebacks name, whatever the host path is
            assert 'File "/opt/posttrain/inside/toyapi.py"' in r.stderr
    with open_sandbox() as sb:  # a sandbox shows only the files it was given
        assert sb.info.modules == ()
        assert "No module named 'toyapi'" in sb.run_python("import toyapi").stderr
    with pytest.raises(ValueError, match="missing.py"):
        open_sandbox(preload=(str(tmp_path / "missing.py"),))
    (tmp_path / "_forkserver.py").write_text("")
    with pytest.raises(ValueError, match="_forkserver"):
        open_sandbox(preload=(str(tmp_path / "_forkserver.py"),))


def test_bad_input_is_rejected(sb):
    with pytest.raises(ValueError):
        sb.run([])
    with pytest.raises(ValueError):
        sb.run("true", timeout=-1)
    for endless in (float("inf"), float("nan")):  # no time limit is not a time limit
        with pytest.raises(ValueError, match="finite"):
            sb.run("true", timeout=endless)
    with pytest.raises(ValueError):
        sb.run("true", env={"A=B": "c"})
    with pytest.raises(ValueError):
        sb.write_file("m.txt", "x", mode=0o17777)
    if sb.info.backend == "process":  # it writes as the host's user: no setuid file of root's
        with pytest.raises(ValueError, match="setuid"):
            sb.write_file("m.txt", "x", mode=0o4755)
    else:  # the sandbox's own uid, on a nosuid mount: kept exactly, as a task folder gives it
        sb.write_file("m.txt", "x", mode=0o4755)
        assert sb.run("stat -c %a m.txt").stdout == "4755\n"


@pytest.mark.parametrize("field,value", [("memory_mb", 0), ("wall_s", -1), ("pids", 1.5),
                                         ("output_kill_bytes", 1), ("wall_s", float("inf")),
                                         ("cpu_s", float("nan"))])
def test_invalid_limits(field, value):
    with pytest.raises(ValueError, match=field):
        Limits(**{field: value})


def test_process_backend_needs_opt_in(monkeypatch):
    monkeypatch.delenv("POSTTRAIN_ALLOW_UNSANDBOXED", raising=False)
    with pytest.raises(SandboxUnavailable, match="allow_unsandboxed"):
        open_sandbox(backend="process")
    with pytest.raises(SandboxUnavailable, match="allow_unsandboxed"):
        check_available(backend="process")  # what a run asks before it starts
    with pytest.raises(ValueError):
        open_sandbox(backend="docker")


def test_auto_without_bwrap_names_the_install_command(monkeypatch):
    from posttrain.sandbox import bwrap

    monkeypatch.delenv("POSTTRAIN_ALLOW_UNSANDBOXED", raising=False)
    monkeypatch.setattr(bwrap, "find_bwrap", lambda: None)
    bwrap.bwrap_problem.cache_clear()
    try:
        with pytest.raises(SandboxUnavailable, match="apt-get install bubblewrap"):
            open_sandbox()
        with pytest.raises(SandboxUnavailable, match="apt-get install bubblewrap"):
            check_available()
        monkeypatch.setenv("POSTTRAIN_ALLOW_UNSANDBOXED", "1")
        check_available()  # the fallback open_sandbox takes below
        with pytest.warns(RuntimeWarning, match="WITHOUT a sandbox"):
            with open_sandbox() as box:
                assert box.info.backend == "process"
                assert box.run("echo ok").stdout == "ok\n"
    finally:
        bwrap.bwrap_problem.cache_clear()


@pytest.mark.parametrize("backend", BACKENDS)
def test_killed_supervisor_makes_calls_raise_broken(backend):
    box = _open(backend)
    os.kill(box._sup_pid, signal.SIGKILL)
    with pytest.raises(SandboxBroken):
        box.run("true")
    with pytest.raises(SandboxBroken):
        box.read_file("x")
    assert issubclass(SandboxBroken, SandboxError)
    box.close()
    with pytest.raises(SandboxError):
        box.run("true")


def _sandbox_processes(uid: int, but: int) -> list[int]:
    pids = []
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{name}/status") as f:
                uid_line = next(line for line in f if line.startswith("Uid:"))
        except (OSError, StopIteration):
            continue
        if int(uid_line.split()[1]) == uid and int(name) != but:
            pids.append(int(name))
    return pids


@needs_bwrap
def test_processes_killed_from_outside_are_replaced():
    with _open("bwrap") as box:
        assert box.run_python("print(1)").ok
        victims = _sandbox_processes(box.host_uid, but=box._sup_pid)
        assert len(victims) >= 2  # the job server and its bubblewrap
        for pid in victims:  # killed from the host (an admin, the OOM killer)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass  # it was exiting anyway
        r = box.run("echo back")
        assert r.stdout == "back\n"  # a new job server was started
        assert box.run_python("print(2)").stdout == "2\n"


def test_numerical_thread_pools_match_the_cpu_quota():
    """A BLAS pool wider than the sandbox's CPU quota only spins (OpenBLAS busy-waits) and is
    throttled: sandboxes size it to `Limits.cpus`, rounded up."""
    from posttrain.sandbox import Limits, open_sandbox
    from posttrain.sandbox.bwrap import bwrap_problem

    if bwrap_problem() is not None:
        pytest.skip(f"bubblewrap unavailable: {bwrap_problem()}")
    for cpus, want in ((1.0, "1"), (1.5, "2")):
        with open_sandbox(Limits(cpus=cpus), backend="bwrap") as sb:
            seen = sb.run_python("import os; print(os.environ['OPENBLAS_NUM_THREADS'], "
                                 "os.environ['OMP_NUM_THREADS'])").stdout.split()
            assert seen == [want, want]
