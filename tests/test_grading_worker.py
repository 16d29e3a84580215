"""The grading child process (`posttrain.verifiers.worker`): timeouts, deaths and raises are told
apart, and the child cannot write files or reach the host's network."""

from __future__ import annotations

import os
import socket
import time

import pytest

from posttrain.verifiers.base import VerifierError
from posttrain.verifiers.worker import AnswerKilledWorker, GradingWorker


def _setup() -> dict:
    return {"calls": 0}


def _handle(state: dict, request: tuple) -> object:
    state["calls"] += 1
    kind, arg = request
    if kind == "echo":
        return arg, state["calls"]
    if kind == "sleep":
        time.sleep(arg)
        return "woke"
    if kind == "raise":
        raise ValueError(arg)
    if kind == "die":
        os._exit(3)
    if kind == "write":
        with open(arg, "w") as f:
            f.write("x" * 100)
        return "wrote"
    if kind == "connect":
        socket.create_connection(("127.0.0.1", arg), timeout=2).close()
        return "connected"
    raise AssertionError(kind)


def _broken_setup() -> None:
    raise ImportError("no such scorer")


@pytest.fixture
def worker():
    w = GradingWorker(_setup, _handle, "test-grading-worker", size=1)
    yield w
    w.close()


def test_answers_raises_and_timeouts_are_told_apart(worker):
    assert worker.call(("echo", 1), 10) == ("ok", (1, 1))
    status, detail = worker.call(("raise", "bad answer"), 10)
    assert status == "raised" and "ValueError: bad answer" in detail
    first = worker.pids()
    assert worker.call(("sleep", 30), 1.0) == ("timeout", None)
    assert worker.pids() == []  # killed; the next call starts a fresh child
    assert worker.call(("echo", 2), 10) == ("ok", (2, 1)) and worker.pids() != first


@pytest.mark.slow
def test_a_slow_answer_holds_up_one_child_not_every_grading():
    import threading

    w = GradingWorker(_setup, _handle, "test-grading-pool", size=2)
    try:
        assert w.call(("echo", 0), 10)[0] == "ok"  # one child started
        slow = threading.Thread(target=w.call, args=(("sleep", 8), 20))
        slow.start()
        time.sleep(0.3)
        t0 = time.monotonic()
        assert w.call(("echo", 1), 10)[0] == "ok"  # the other child (started now) answers
        assert time.monotonic() - t0 < 6  # not after the 8 s answer
        slow.join()
        assert len(w.pids()) == 2
    finally:
        w.close()


def test_a_child_killed_by_an_input_twice_fails_that_input_only(worker):
    assert worker.call(("echo", 1), 10)[0] == "ok"
    with pytest.raises(AnswerKilledWorker, match="died twice"):
        worker.call(("die", None), 10)
    assert worker.call(("echo", 2), 10) == ("ok", (2, 1))


def test_a_child_that_cannot_start_is_an_infrastructure_error():
    w = GradingWorker(_broken_setup, _handle, "test-broken-worker", size=1)
    with pytest.raises(VerifierError, match="could not start"):
        w.call(("echo", 1), 10)
    w.close()


def test_the_child_cannot_write_files_or_reach_the_host(worker, tmp_path):
    target = tmp_path / "planted"
    status, detail = worker.call(("write", str(target)), 10)
    assert status == "raised" and "File too large" in detail and target.read_bytes() == b""
    if os.geteuid() != 0:
        pytest.skip("a network namespace of its own needs root (or user namespaces) here")
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        status, detail = worker.call(("connect", listener.getsockname()[1]), 10)
    assert status == "raised" and ("Errno" in detail or "refused" in detail or "unreachable" in detail)
