"""Cross-episode leaks: what one episode leaves in a sandbox, the next one in it never sees.

Episode 1 plants everything an episode could leave behind (daemons that double-forked and
setsid'd, nohup'd, SIGTERM-ignoring and own-process-group processes, a process that keeps
writing, files and dotfiles in every writable place, FIFOs and unix sockets, changed modes,
variables exported from shell rc files, System V IPC); the sandbox is reset; episode 2 looks for
each of them from inside. Both backends where a check applies (the process backend isolates
nothing: it has no /dev/shm or IPC namespace of its own).
"""

from __future__ import annotations

import time
import warnings

import pytest

from posttrain.sandbox import Limits, open_sandbox
from posttrain.sandbox.bwrap import bwrap_problem
from posttrain.sandbox.reset import PlaceState, ResetFacts, after_episode, count_mounts, judge

PROBLEM = bwrap_problem()
needs_bwrap = pytest.mark.skipif(PROBLEM is not None, reason=f"bubblewrap unavailable: {PROBLEM}")
MARK = "leakmark"

PLANT = r"""
set -e
# daemons: double fork + setsid, nohup, SIGTERM ignored, own process group, a writer
(setsid sh -c 'sh -c "sleep 300; : leakmark-setsid" & exit 0' &)
nohup sh -c 'sleep 301; : leakmark-nohup' >/dev/null 2>&1 &
python3 -c 'import signal,time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(302)  # leakmark' &
python3 -c 'import os,time; os.setpgid(0,0); time.sleep(303)  # leakmark' &
sh -c 'while true; do echo x >> "$TMPDIR/ticker"; sleep 0.01; done  # leakmark' &
# files and dotfiles in every writable place
echo secret > planted.txt; echo secret > .hidden; mkdir -p sub/deep; echo s > sub/deep/f
echo secret > "$TMPDIR/planted"; mkdir -p "$HOME/.config/tool"; echo s > "$HOME/.config/tool/rc"
echo 'export LEAKED=from-bashrc' >> "$HOME/.bashrc"
echo 'export LEAKED=from-profile' >> "$HOME/.profile"
echo 'export LEAKED=from-bash-profile' >> "$HOME/.bash_profile"
if [ -d /dev/shm ] && [ -w /dev/shm ] && [ "$SHM" = 1 ]; then echo s > /dev/shm/planted; fi
# FIFOs and unix sockets (a bound path socket, and an abstract one held by a daemon)
mkfifo fifo "$TMPDIR/fifo"
python3 -c '
import os, socket
for p in ("sock", os.environ["TMPDIR"] + "/sock"):
    socket.socket(socket.AF_UNIX).bind(p)
'
python3 -c '
import socket, time
s = socket.socket(socket.AF_UNIX); s.bind("\0leakmark-abstract"); s.listen(); time.sleep(305)
' &
# permissions and modes
chmod 000 planted.txt; chmod 777 .; chmod 1777 "$TMPDIR"
echo planted
"""

LOOK = r"""
# (the marker is split in two so that this script's own command line does not match it)
found=""
for d in /proc/[0-9]*; do
  if tr '\0' ' ' < $d/cmdline 2>/dev/null | grep -q "leak""mark"; then found="$found process:$(tr '\0' ' ' < $d/cmdline)"; fi
done
sleep 0.1
for f in "$TMPDIR/ticker" planted.txt .hidden sub fifo sock "$TMPDIR/planted" "$TMPDIR/fifo" "$TMPDIR/sock" "$HOME/.bashrc" "$HOME/.profile" "$HOME/.config"; do
  if [ -e "$f" ] || [ -L "$f" ]; then found="$found file:$f"; fi
done
left=$(ls -A . "$TMPDIR" | grep -v ':$' | grep -v '^$' || true)
[ -z "$left" ] || found="$found entries:$left"
if [ "$SHM" = 1 ]; then
  [ -z "$(ls -A /dev/shm)" ] || found="$found shm:$(ls -A /dev/shm)"
  [ "$(stat -c %a /dev/shm)" = "${TMP_MODE:-755}" ] || found="$found shm-mode:$(stat -c %a /dev/shm)"
  [ "$(wc -l < /proc/sysvipc/shm)" = 1 ] || found="$found sysv-shm"
  [ "$(stat -c %a .)" = 755 ] || found="$found ws-mode:$(stat -c %a .)"
  [ "$(stat -c %a /tmp)" = "${TMP_MODE:-755}" ] || found="$found tmp-mode:$(stat -c %a /tmp)"
fi
grep -q "leak""mark" /proc/net/unix && found="$found abstract-socket"
for sh in "sh -c" "bash -c" "bash -lc"; do
  v=$($sh 'echo ${LEAKED:-clean}')
  [ "$v" = clean ] || found="$found env($sh):$v"
done
echo "found:${found:-nothing}"
"""

SYSV = ("import ctypes; l = ctypes.CDLL(None); i = l.shmget(0x1eaf, 4096, 0o1666); "
        "print('shm', i)")


def _open(backend: str, **kw):
    if backend == "process":
        warnings.simplefilter("ignore", RuntimeWarning)
        return open_sandbox(Limits(wall_s=20), backend="process", allow_unsandboxed=True, **kw)
    return open_sandbox(Limits(wall_s=20), backend="bwrap", **kw)


BACKENDS = [pytest.param("bwrap", marks=needs_bwrap), "process"]


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_next_episode_sees_nothing_of_the_last(backend):
    env = {"SHM": "1" if backend == "bwrap" else "0"}
    with _open(backend) as sb:
        clean = sb.run(LOOK, env=env)
        assert clean.stdout.strip() == "found:nothing", clean  # the probe itself is sound
        sb.write_file("task.txt", "the task's file")
        planted = sb.run(PLANT, env=env)
        assert planted.ok and "planted" in planted.stdout, planted
        if backend == "bwrap":
            assert sb.run_python(SYSV).ok
        sb.snapshot()  # an episode's snapshot must not survive either
        seen = sb.run(LOOK, env=env)
        for what in ("setsid", "nohup", "SIGTERM", "setpgid", "ticker", "abstract", "file:",
                     "env(bash -lc)"):
            assert what in seen.stdout, (what, seen)  # all there before the reset
        report = sb.reset()
        assert report.reusable, report
        assert report.killed >= 5, report
        after = sb.run(LOOK, env=env)
        assert after.stdout.strip() == "found:nothing", after
        assert sb.list_files() == []
        # and the sandbox works as a fresh one would
        sb.write_file("next.txt", "episode 2")
        assert sb.run("cat next.txt").stdout == "episode 2"
        assert sb.run_python("print(6 * 7)").stdout == "42\n"


def test_reset_of_a_process_sandbox_whose_job_server_was_killed_is_refused():
    with _open("process") as sb:
        sb.run("kill -9 $PPID")  # the job server is the command's parent
        report = sb.reset()
        assert not report.reusable and "job server" in report.reason, report


KILLER = ("(setsid sh -c 'while true; do kill -9 -1 2>/dev/null; echo 1 > /tmp/r 2>/dev/null; "
          "echo 1 > $HOME/r 2>/dev/null; sleep 0.01; done  # leakmark' > /dev/null 2>&1 &); sleep 0.1")


def _kill_job_server_from_the_host(sb) -> None:
    """What an OOM kill does: the job server (the sandbox's pid 1) dies, and its namespace."""
    import os
    import signal

    def children(pid):
        try:
            with open(f"/proc/{pid}/task/{pid}/children") as f:
                return [int(x) for x in f.read().split()]
        except OSError:
            return []

    todo, servers = [sb._proc.pid], []
    while todo:
        pid = todo.pop()
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            if not argv[0].endswith(b"bwrap") and b"/opt/posttrain/inside/_forkserver.py" in argv:
                servers.append(pid)
                continue
        except OSError:
            continue
        todo += children(pid)
    assert len(servers) == 1, servers
    with open(f"/proc/{servers[0]}/stat") as f:
        bwrap = int(f.read().rsplit(")", 1)[1].split()[1])  # its parent: the outer bubblewrap
    os.kill(servers[0], signal.SIGKILL)
    deadline = time.monotonic() + 10  # until bubblewrap has followed it, as after an OOM kill
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{bwrap}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return
        except OSError:
            return
        time.sleep(0.01)


@needs_bwrap
@pytest.mark.parametrize("kill", ["kill -9 $PPID", "kill -9 1", "kill -9 -1", KILLER])
def test_an_episode_cannot_kill_the_job_server_and_leaves_nothing(kill):
    """The job server is the sandbox's pid 1: an episode that tries to kill it (once, or with a
    daemon that keeps killing and writing) kills its own processes only; the reset is an
    ordinary one (no restart), and the next episode sees nothing of the last."""
    env = {"SHM": "1"}
    with _open("bwrap") as sb:
        assert sb.run(PLANT, env=env).ok
        assert sb.run_python(SYSV).ok
        sb.run(kill)
        if kill != KILLER:  # (the daemon would kill this job too)
            assert sb.run("echo alive").stdout == "alive\n"  # the same server
        report = sb.reset()
        assert report.reusable and not report.details.get("server_restarted"), report
        after = sb.run(LOOK, env=env)
        assert after.stdout.strip() == "found:nothing", after
        assert sb.list_files() == []
        assert sb.run_python("print(6 * 7)").stdout == "42\n"


@needs_bwrap
@pytest.mark.parametrize("daemon", [False, True])
def test_reset_restarts_a_killed_job_server_and_leaves_nothing(daemon):
    """The job server killed from outside (as the OOM killer would), with the episode's
    processes (and a daemon that keeps killing and writing) or without: the reset starts a new
    server, and the next episode sees nothing of the last."""
    env = {"SHM": "1"}
    with _open("bwrap") as sb:
        assert sb.run(PLANT, env=env).ok
        assert sb.run_python(SYSV).ok
        if daemon:
            sb.run(KILLER)
        _kill_job_server_from_the_host(sb)
        report = sb.reset()
        assert report.reusable and report.details.get("server_restarted"), report
        after = sb.run(LOOK, env=env)
        assert after.stdout.strip() == "found:nothing", after
        assert sb.list_files() == []
        assert sb.run_python("print(6 * 7)").stdout == "42\n"
        again = sb.reset()  # and the next reset is an ordinary one
        assert again.reusable and not again.details.get("server_restarted"), again


@needs_bwrap
def test_orphans_of_jobs_are_reaped_by_the_job_server():
    """As pid 1 the server reaps the orphans reparented to it: no zombie is left, between jobs
    or during one, and a job still waits for its own children."""
    with _open("bwrap") as sb:
        sb.run("for i in 1 2 3 4 5; do (sleep 0.05 &); done; (setsid sleep 0.05 &)")
        r = sb.run("sleep 0.5; cat /proc/[0-9]*/stat 2>/dev/null | awk '$3 == \"Z\"' | wc -l; "
                   "(sleep 0.05 &); sleep 0.3; cat /proc/[0-9]*/stat 2>/dev/null | awk '$3 == \"Z\"' | wc -l")
        assert r.stdout.split() == ["0", "0"], r
        assert sb.run_python("import subprocess; print(subprocess.run(['sh', '-c', 'exit 3']).returncode)"
                             ).stdout == "3\n"
        assert sb.reset().reusable


@needs_bwrap
def test_old_snapshot_ids_do_not_name_new_snapshots():
    with _open("bwrap") as sb:
        sb.write_file("a", "episode 1")
        old = sb.snapshot()
        assert sb.reset().reusable
        with pytest.raises(ValueError, match="unknown snapshot"):
            sb.restore(old)
        sb.write_file("a", "episode 2")
        new = sb.snapshot()
        assert new != old


@needs_bwrap
def test_many_resets_do_not_stack_mounts():
    with _open("bwrap") as sb:
        for i in range(30):
            sb.run(f"echo {i} > f; echo {i} > /tmp/f")
            sb.snapshot()
            sb.restore(sb.snapshot())
            assert sb.reset().reusable
        table = sb.run("cat /proc/self/mountinfo").stdout
        assert count_mounts(table, "/ws") == 2 and count_mounts(table, "/tmp") == 2, table


# -- the pure decision part --------------------------------------------------------------
def test_judge_rules():
    ok = PlaceState("/ws")
    assert judge(ResetFacts(killed=3, places=(ok,))) == (True, "")
    assert not judge(ResetFacts(killed=None))[0]
    assert "processes left" in judge(ResetFacts(killed=1, processes_left=(7,)))[1]
    assert "job server" in judge(ResetFacts(killed=0, server="gone"))[1]
    assert "restore failed" in judge(ResetFacts(killed=0, restore_error="EBUSY"))[1]
    assert "not empty" in judge(ResetFacts(killed=0, places=(PlaceState("/tmp", ("x",)),)))[1]
    assert "mode" in judge(ResetFacts(killed=0, places=(PlaceState("/ws", mode=0o777),)))[1]
    assert "mode" in judge(ResetFacts(killed=0, places=(PlaceState("/ws", owner_ok=False),)))[1]
    assert "mounts" in judge(ResetFacts(killed=0, places=(PlaceState("/ws", mounts=3),)))[1]
    assert "IPC" in judge(ResetFacts(killed=0, places=(ok,), ipc_left=1))[1]
    assert judge(ResetFacts(killed=0, places=(PlaceState("/ws", mounts=0),),
                            expected_mounts=0))[0]


def test_count_mounts_and_after_episode():
    table = ("1 0 0:1 / / ro - tmpfs tmpfs ro\n2 1 0:2 / /ws ro - tmpfs tmpfs ro\n"
             "3 2 0:3 / /ws rw - overlay overlay rw\n4 1 0:4 / /wsx rw - tmpfs tmpfs rw\n")
    assert count_mounts(table, "/ws") == 2 and count_mounts(table, "/tmp") == 0
    assert after_episode(reuse=True, closed=False, episodes=1, max_episodes=10) == "reset"
    assert after_episode(reuse=False, closed=False, episodes=1, max_episodes=10) == "close"
    assert after_episode(reuse=True, closed=True, episodes=1, max_episodes=10) == "close"
    assert after_episode(reuse=True, closed=False, episodes=10, max_episodes=10) == "close"


MQUEUE = r'''
import ctypes, os, sys
rt = ctypes.CDLL("librt.so.1", use_errno=True)
flags = os.O_CREAT | os.O_RDWR if sys.argv[1] == "make" else os.O_RDONLY
print(rt.mq_open(b"/leakmark", flags, 0o600, None), ctypes.get_errno())
'''


@needs_bwrap
def test_a_posix_message_queue_does_not_outlive_the_episode():
    # POSIX mqueues live in the sandbox's IPC namespace, not in a file any reset restores:
    # the reset unlinks them (ipc.py), so the next episode cannot open the last one's
    with open_sandbox() as sb:
        assert sb.run_python(MQUEUE, args=["make"]).stdout.split()[0] != "-1"
        assert sb.run_python(MQUEUE, args=["look"]).stdout.split()[0] != "-1"  # the probe works
        assert sb.reset().reusable
        fd, errno = sb.run_python(MQUEUE, args=["look"]).stdout.split()
        assert (fd, errno) == ("-1", "2")  # ENOENT
