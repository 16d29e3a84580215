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


def test_a_fork_grades_with_children_of_its_own(worker):
    """A process forked after its parent started a grading child (`tasks check --workers 2`
    after a check in the parent) graded every answer as an infrastructure error: it polled the
    parent's child. It starts its own and leaves the parent's running."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    assert worker.call(("echo", 1), 10) == ("ok", (1, 1))
    parents = worker.pids()
    _IN_FORK.append(worker)  # the fork inherits it (a worker does not pickle)
    try:
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("fork")) as pool:
            status, (echoed, calls), pids = pool.submit(_call_in_fork).result()
    finally:
        _IN_FORK.clear()
    assert (status, echoed, calls) == ("ok", 2, 1)  # a fresh child: its first call
    assert pids and not set(pids) & set(parents)
    assert worker.pids() == parents and worker.call(("echo", 3), 10) == ("ok", (3, 2))  # untouched


_IN_FORK: list[GradingWorker] = []


def _call_in_fork() -> tuple[str, tuple, list[int]]:
    status, result = _IN_FORK[0].call(("echo", 2), 10)
    return status, result, _IN_FORK[0].pids()


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
