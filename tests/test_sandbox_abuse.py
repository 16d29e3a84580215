"""The abuse suite (cases in `posttrain.sandbox.abuse`, shared with benchmarks/sandbox.py): every
hostile program is contained, leaves no process behind, and the next sandbox is normal. Plus
isolation between two sandboxes that run at the same time."""

from __future__ import annotations

import threading

import pytest

from posttrain.sandbox import Limits, open_sandbox
from posttrain.sandbox.abuse import CASES, run_case
from posttrain.sandbox.bwrap import bwrap_problem

PROBLEM = bwrap_problem()
pytestmark = pytest.mark.skipif(PROBLEM is not None, reason=f"bubblewrap unavailable: {PROBLEM}")


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_abuse_is_contained(case):
    outcome = run_case(case, lambda limits: open_sandbox(limits, backend="bwrap"))
    assert outcome.contained, outcome.detail
    with open_sandbox(Limits(wall_s=5), backend="bwrap") as after:  # the next one is normal
        assert after.run("echo ok").stdout == "ok\n"


@pytest.mark.slow
def test_two_concurrent_sandboxes_are_isolated():
    a, b = open_sandbox(backend="bwrap"), open_sandbox(backend="bwrap")
    try:
        assert a.host_uid != b.host_uid
        a.write_file("secret.txt", "only-a")
        results = {}

        def hold(name, sb):  # each keeps a process alive while the other looks around
            results[name] = sb.run("sleep 1.5 & ls /ws; cat /proc/*/cmdline 2>/dev/null "
                                   "| tr '\\0' ' '; wait", timeout=10)

        threads = [threading.Thread(target=hold, args=(n, s)) for n, s in (("a", a), ("b", b))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert "secret.txt" in results["a"].stdout
        assert "secret.txt" not in results["b"].stdout
        with pytest.raises(FileNotFoundError):
            b.read_file("secret.txt")
        r = b.run("ls /proc/*/root/ws 2>&1; kill -9 -1; true")
        assert "secret.txt" not in r.stdout
        assert a.run("cat secret.txt").stdout == "only-a"  # b's kill -1 did not reach a
    finally:
        a.close()
        b.close()
