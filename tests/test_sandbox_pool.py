"""SandboxPool: warm sandboxes, never reused across episodes, broken ones replaced."""

from __future__ import annotations

import os
import signal
import time

import pytest

from posttrain.sandbox import Limits, SandboxBroken, SandboxPool
from posttrain.sandbox.bwrap import bwrap_problem

PROBLEM = bwrap_problem()
pytestmark = pytest.mark.skipif(PROBLEM is not None, reason=f"bubblewrap unavailable: {PROBLEM}")


def test_each_episode_gets_a_fresh_sandbox():
    with SandboxPool(size=2, limits=Limits(wall_s=5), backend="bwrap") as pool:
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
        assert pool.stats["handed_out"] == 4


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
        with pool.sandbox() as sb:
            assert sb is not waiting
            assert sb.run("echo fine").stdout == "fine\n"
        assert pool.stats["replaced"] >= 1


def test_pool_rejects_bad_size():
    with pytest.raises(ValueError, match="size"):
        SandboxPool(size=0)
