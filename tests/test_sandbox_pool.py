"""SandboxPool: warm sandboxes, reset to pristine between episodes (or fresh each), broken ones
and ones whose reset is not clean replaced."""

from __future__ import annotations

import os
import signal
import time

import pytest

from posttrain.sandbox import Limits, SandboxBroken, SandboxPool
from posttrain.sandbox.bwrap import bwrap_problem

PROBLEM = bwrap_problem()
pytestmark = pytest.mark.skipif(PROBLEM is not None, reason=f"bubblewrap unavailable: {PROBLEM}")


def test_fresh_mode_gives_each_episode_a_new_sandbox():
    with SandboxPool(size=2, limits=Limits(wall_s=5), backend="bwrap", reuse=False) as pool:
        seen = []
        for i in range(4):
            with pool.sandbox() as sb:
                assert sb.list_files() == []  # nothing of the previous episode
                assert sb.run("ls /tmp").stdout == ""
                sb.write_file("episode.txt", str(i))
                sb.run("sleep 60 >/dev/null 2>&1 &")  # a daemon that would outlive the episode
                seen.append(sb.id)
            assert sb.closed
        assert len(set(seen)) == 4
        assert pool.stats["handed_out"] == 4 and pool.stats["resets"] == 0


def test_reuse_mode_resets_and_reuses_the_same_sandbox():
    with SandboxPool(size=1, limits=Limits(wall_s=5), backend="bwrap") as pool:
        seen = []
        for i in range(4):
            with pool.sandbox() as sb:
                assert sb.list_files() == []  # nothing of the previous episode
                assert sb.run("ls -A /tmp /dev/shm; pgrep -c sleep || true").stdout == \
                    "/dev/shm:\n\n/tmp:\n0\n"
                sb.write_file("episode.txt", str(i))
                sb.run("echo x > /tmp/t; echo y > /dev/shm/s; sleep 60 >/dev/null 2>&1 &")
                seen.append(sb.id)
            assert not sb.closed
        assert len(set(seen)) == 1
        assert pool.stats["resets"] == 4 and pool.stats["discards"] == 0
        assert pool.stats["booted"] == 1


def test_unclean_reset_discards_and_boots_another(monkeypatch):
    from posttrain.sandbox.reset import ResetReport

    with SandboxPool(size=1, limits=Limits(wall_s=5), backend="bwrap") as pool:
        with pool.sandbox() as sb:
            # a reset that found the sandbox unclean (what it found is `test_sandbox_reset`'s)
            monkeypatch.setattr(sb, "reset", lambda: ResetReport(False, "job server: gone"))
        assert sb.closed
        assert pool.stats["discards"] == 1
        assert list(pool.stats["discard_reasons"]) == ["job server"]
        with pool.sandbox() as other:
            assert other.id != sb.id and other.run("echo ok").stdout == "ok\n"
        assert pool.stats["booted"] == 2


def test_an_episode_that_kills_everything_or_a_killed_job_server_costs_no_boot():
    from tests.test_sandbox_reset import _kill_job_server_from_the_host

    with SandboxPool(size=1, limits=Limits(wall_s=5), backend="bwrap") as pool:
        with pool.sandbox() as sb:
            sb.run("echo x > f; kill -9 -1")  # not the job server: it is the sandbox's pid 1
        with pool.sandbox() as again:
            assert again.id == sb.id and again.list_files() == []
            assert again.run("echo ok").stdout == "ok\n"
        assert pool.stats["server_restarts"] == 0
        with pool.sandbox() as again:
            again.run("echo x > f")
            _kill_job_server_from_the_host(again)  # as the OOM killer would
        with pool.sandbox() as again:
            assert again.id == sb.id and again.list_files() == []
            assert again.run("echo ok").stdout == "ok\n"
        assert pool.stats["server_restarts"] == 1 and pool.stats["discards"] == 0
        assert pool.stats["booted"] == 1


def test_reuse_mode_boots_no_more_than_size_for_size_workers():
    import threading

    with SandboxPool(size=2, limits=Limits(wall_s=5), backend="bwrap") as pool:
        ids, lock = set(), threading.Lock()
        both_hold_one = threading.Barrier(2, timeout=60)  # else one thread may run all its episodes first

        def episodes():
            for i in range(4):
                with pool.sandbox() as sb:
                    sb.run("true")
                    with lock:
                        ids.add(sb.id)
                    if i == 0:
                        both_hold_one.wait()

        threads = [threading.Thread(target=episodes) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(ids) == 2 and pool.stats["booted"] == 2
        assert pool.stats["resets"] == 8


def test_reuse_mode_serves_a_caller_that_holds_more_than_size(monkeypatch):
    import contextlib

    from posttrain.sandbox import pool as pool_module

    monkeypatch.setattr(pool_module, "IDLE_GRACE_S", 1.0)
    with SandboxPool(size=1, limits=Limits(wall_s=5), backend="bwrap") as pool:
        with contextlib.ExitStack() as stack:  # a driver that opens every episode at once
            held = [stack.enter_context(pool.sandbox()) for _ in range(3)]
            assert len({sb.id for sb in held}) == 3
        # demand that comes back within the grace finds them booted ...
        assert pool._ready.qsize() == 3 and pool.stats["closed_idle"] == 0
        with pool.sandbox() as again:
            assert again.id in {sb.id for sb in held}
        # ... and once no caller has waited for the grace, at most `size` idle ones are kept
        deadline = time.monotonic() + 30
        while pool._ready.qsize() > 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pool._ready.qsize() == 1 and pool.stats["closed_idle"] == 2
        assert pool.stats["booted"] == 3


def test_a_sandbox_serves_at_most_max_episodes():
    with SandboxPool(size=1, limits=Limits(wall_s=5), backend="bwrap", max_episodes=2) as pool:
        seen = []
        for _ in range(3):
            with pool.sandbox() as sb:
                seen.append(sb.id)
        assert seen[0] == seen[1] != seen[2]


def test_warm_pool_hands_out_without_waiting():
    with SandboxPool(size=2, limits=Limits(wall_s=5), backend="bwrap") as pool:
        deadline = time.monotonic() + 30
        while pool._ready.qsize() < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        t = time.monotonic()
        with pool.sandbox() as sb:
            took = time.monotonic() - t
            assert sb.run_python("print(6 * 7)").stdout == "42\n"
        assert took < 0.5, f"taking a booted sandbox took {took:.2f} s"


def test_broken_sandbox_is_replaced_and_caller_carries_on():
    with SandboxPool(size=1, limits=Limits(wall_s=5), backend="bwrap") as pool:
        with pool.sandbox() as sb:
            os.kill(sb._sup_pid, signal.SIGKILL)  # its process killed from outside
            with pytest.raises(SandboxBroken):
                sb.run("true")
        # a ready sandbox whose supervisor died while waiting is replaced, not handed out
        deadline = time.monotonic() + 30
        while pool._ready.qsize() < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        waiting = pool._ready.queue[0]
        os.kill(waiting._sup_pid, signal.SIGKILL)
        waiting._proc.wait(timeout=30)  # it has died (the pool checks without a round trip)
        with pool.sandbox() as sb:
            assert sb is not waiting
            assert sb.run("echo fine").stdout == "fine\n"
        assert pool.stats["replaced"] >= 1


def test_pool_rejects_bad_settings():
    with pytest.raises(ValueError, match="size"):
        SandboxPool(size=0)
    with pytest.raises(ValueError, match="reuse"):
        SandboxPool(size=1, reuse="yes")
    with pytest.raises(ValueError, match="max_episodes"):
        SandboxPool(size=1, max_episodes=0)


def test_a_caller_waits_for_a_sandbox_being_reset_rather_than_a_boot(monkeypatch):
    import threading

    with SandboxPool(size=1, limits=Limits(wall_s=5), backend="bwrap") as pool:
        got = []

        def take():
            with pool.sandbox() as again:
                got.append(again.id)

        taker = threading.Timer(0.2, take)  # asks while the (slow) reset below runs
        with pool.sandbox() as sb:
            real = sb.reset
            monkeypatch.setattr(sb, "reset", lambda: time.sleep(0.5) or real())
            taker.start()
        taker.join()
        assert got == [sb.id] and pool.stats["booted"] == 1  # it waited: no boot
