"""Grading sandboxes from a reset pool: pristine for every grade, never an episode's sandbox.

What a grade leaves in its sandbox (a Harbor `test.sh` runs the agent's code there) and what an
adversarial episode leaves in its own, the next grader never sees; a grading sandbox whose reset
is not clean is discarded; "fresh" per grade stays available.
"""

from __future__ import annotations

import pytest

from posttrain.sandbox import Limits, open_sandbox
from posttrain.sandbox.bwrap import bwrap_problem
from posttrain.sandbox.keyed import ConfigPool
from posttrain.sandbox.reset import ResetReport
from posttrain.verifiers import grading
from posttrain.verifiers.base import Outcome, VerifierError
from tests.test_sandbox_reset import LOOK, PLANT

PROBLEM = bwrap_problem()
needs_bwrap = pytest.mark.skipif(PROBLEM is not None, reason=f"bubblewrap unavailable: {PROBLEM}")
ENV = {"SHM": "1", "TMP_MODE": "1777"}
"""grading sandboxes have two uids: their /tmp and /dev/shm are everyone's (sticky), as pristine"""


@pytest.fixture
def mode(monkeypatch):
    """Sets the grading mode for one test, with a pool of its own; restores both after."""
    monkeypatch.delenv(grading.GRADING_SANDBOXES_ENV, raising=False)
    grading.close_grading_pool()

    def set_(m):
        grading.set_grading_mode(m)
    yield set_
    grading.set_grading_mode(None)
    grading.close_grading_pool()


@needs_bwrap
def test_grader_after_an_adversarial_episode_and_grade_sees_none_of_it(mode):
    mode("reset")
    with open_sandbox(Limits(wall_s=20)) as episode:
        planted = episode.run(PLANT, env=ENV)  # the adversarial episode, in its own sandbox
        assert planted.ok, planted
        with grading.grading_context(Outcome(None, episode), include=["none-such"]) as grader:
            first = grader.id
            assert first != episode.id
            assert grader.run(LOOK, env=ENV).stdout.strip() == "found:nothing"
            # code a grader runs (a test.sh importing the agent's module) leaves everything too
            assert grader.run(PLANT, env=ENV).ok
            assert "leakmark" in grader.run(LOOK, env=ENV).stdout
        pool = grading.grading_pool()
        assert pool.settle()  # the reset runs after the grade, in the background
        assert pool.stats["resets"] == 1 and pool.idle() == 1
        with grading.grading_context(Outcome(None, episode), include=["none-such"]) as grader:
            assert grader.id == first, "the reset sandbox serves the next grade"
            seen = grader.run(LOOK, env=ENV)
            assert seen.stdout.strip() == "found:nothing", seen
            assert grader.list_files() == []
        assert pool.settle()
        assert pool.stats == {**pool.stats, "booted": 1, "reused": 1, "resets": 2, "discards": 0}
        assert episode.id not in {sb.id for _, sb in pool._idle}


@needs_bwrap
def test_declared_artifacts_are_copied_and_nothing_else(mode):
    mode("reset")
    with open_sandbox(Limits(wall_s=20)) as episode:
        episode.write_file("out.txt", "the answer")
        episode.write_file("conftest.py", "raise SystemExit(0)")
        for _ in range(2):  # a fresh boot, then the same sandbox reset
            with grading.grading_context(Outcome(None, episode), include=["out.txt"]) as grader:
                assert grader.list_files() == ["out.txt"]
                assert grader.read_file("out.txt") == b"the answer"
        assert grading.grading_pool().stats["reused"] == 1


@needs_bwrap
def test_a_grading_sandbox_that_does_not_reset_cleanly_is_discarded(mode, monkeypatch):
    mode("reset")
    with grading.grading_sandbox(None, ()) as grader:
        first = grader.id
        # a reset that found the sandbox unclean (what it found is `test_sandbox_reset`'s)
        monkeypatch.setattr(grader, "reset", lambda: ResetReport(False, "job server: gone"))
    pool = grading.grading_pool()
    assert pool.settle()
    assert pool.stats["discards"] == 1 and "job server" in pool.stats["discard_reasons"]
    assert pool.idle() == 0
    with grading.grading_sandbox(None, ()) as grader:
        assert grader.id != first
        assert grader.run_python("print(6 * 7)").stdout == "42\n"


@needs_bwrap
def test_fresh_mode_boots_one_per_grade(mode):
    mode("fresh")
    ids = []
    for _ in range(2):
        with grading.grading_sandbox(None, ()) as grader:
            ids.append(grader.id)
    assert ids[0] != ids[1]
    assert grading._pool is None


def test_a_bad_mode_is_refused_naming_the_variable(mode, monkeypatch):
    monkeypatch.setenv(grading.GRADING_SANDBOXES_ENV, "reuse")
    with pytest.raises(ValueError, match="POSTTRAIN_GRADING_SANDBOXES='reuse'"):
        grading.grading_mode()
    with pytest.raises(ValueError, match="POSTTRAIN_GRADING_SANDBOXES='reuse'"):
        with grading.grading_sandbox(None, ()):  # not an infrastructure error (retried forever)
            pass
    with pytest.raises(ValueError, match="grading mode must be one of"):
        grading.set_grading_mode("pooled")


def test_a_sandbox_that_cannot_be_had_is_an_infrastructure_error(mode, monkeypatch):
    mode("reset")

    def boom(*a, **k):
        raise RuntimeError("no bubblewrap today")
    monkeypatch.setattr(grading.grading_pool(), "_opener", boom)
    with pytest.raises(VerifierError, match="no bubblewrap today"):
        with grading.grading_sandbox(None, ()):
            pass


# -- the pool's bookkeeping, with stand-in sandboxes (no boots) ----------------------------
class Fake:
    n = 0

    def __init__(self, limits, **kw):
        Fake.n += 1
        self.id, self.limits, self.kw = f"fake{Fake.n}", limits, kw
        self.closed, self.dead, self.reset_ok, self.resets = False, False, True, 0

    def alive(self):
        return not self.dead

    def reset(self):
        self.resets += 1
        return ResetReport(self.reset_ok, "" if self.reset_ok else "restore failed: boom", seconds=0.001)

    def close(self, wait=True):
        self.closed = True


def test_pool_keys_by_configuration():
    pool = ConfigPool(opener=Fake)
    with pool.sandbox(Limits()) as a:
        pass
    with pool.sandbox(Limits(), preload=("json",)) as b:
        assert b is not a  # another configuration: booted
    with pool.sandbox(Limits(wall_s=3)) as c:
        assert c not in (a, b)
    with pool.sandbox(Limits(), image={"digest": "x", "layers": ["l1"]}) as d:
        assert d not in (a, b, c)
    with pool.sandbox(Limits()) as again:
        assert again is a and a.resets == 1
    with pool.sandbox(Limits(), image={"layers": ["l1"], "digest": "x"}) as same_image:
        assert same_image is d
    assert pool.stats["booted"] == 4 and pool.stats["reused"] == 2


def test_pool_bounds_idle_sandboxes_and_replaces_dead_and_dirty_ones():
    pool = ConfigPool(opener=Fake, max_idle_per_key=1, max_idle=2, max_episodes=3)
    with pool.sandbox() as a, pool.sandbox() as b:  # two at once: two boots, one kept
        pass
    assert pool.idle() == 1 and pool.stats["closed_idle"] == 1 and a.closed != b.closed
    kept = b if a.closed else a
    with pool.sandbox(preload=("json",)), pool.sandbox(preload=("os",)):
        pass
    assert pool.idle() == 2 and kept.closed  # least recently used goes beyond max_idle
    with pool.sandbox(preload=("json",)) as s:
        pass
    with pool.sandbox(preload=("os",)) as u:
        u.reset_ok = False
    assert u.closed and pool.stats["discard_reasons"] == {"restore failed": 1}
    with pool.sandbox(preload=("os",)) as v:
        assert v is not u
    pool.close()
    assert pool.idle() == 0 and all(sb.closed for sb in (s, v))


def test_a_dead_idle_sandbox_is_replaced_and_uses_are_bounded():
    pool = ConfigPool(opener=Fake, max_episodes=2)
    with pool.sandbox() as a:
        pass
    a.dead = True
    with pool.sandbox() as b:
        assert b is not a and a.closed and pool.stats["replaced"] == 1
    with pool.sandbox() as c:
        assert c is b
    assert b.closed and pool.idle() == 0  # its second use was its last


@needs_bwrap
def test_the_first_grading_program_copies_the_artifacts_itself(mode, monkeypatch):
    """One program per grade: the copy runs at the start of the grader, which sees the declared
    artifacts (and counts as having used the policy's files from its first statement)."""
    mode("reset")
    with open_sandbox(Limits(wall_s=20)) as episode:
        episode.write_file("out.txt", "the answer")
        episode.write_file("other.txt", "not declared")
        with grading.grading_context(Outcome(None, episode), include=["out.txt"]) as grader:
            inner = grader.sandbox
            runs = []
            real = inner.run_python
            monkeypatch.setattr(inner, "run_python", lambda *a, **k: runs.append(1) or real(*a, **k))
            found = grading.run_grader(grader, "emit({'files': sorted(os.listdir('.')), "
                                               "'text': open('out.txt').read()})", {}, timeout=20, label="t")
            assert found == {"files": ["out.txt"], "text": "the answer"} and len(runs) == 1
            # a second program in the same context copies nothing again
            assert grading.run_grader(grader, "emit({'n': len(os.listdir('.'))})", {}, timeout=20,
                                      label="t") == {"n": 1} and len(runs) == 2
        with grading.grading_context(Outcome(None, episode), include=["out.txt"]) as grader:
            with pytest.raises(grading.GradingFailed):  # died after the copy: the policy's failure
                grading.run_grader(grader, "raise SystemExit(3)", {}, timeout=20, label="t")


def test_a_checkout_does_not_ping_a_sandbox_that_just_answered_its_reset():
    class Counting(Fake):
        def alive(self, probe=True):
            self.pings = getattr(self, "pings", 0) + probe
            return not self.dead

    pool = ConfigPool(opener=Counting)
    with pool.sandbox() as a:
        pass
    with pool.sandbox() as again:
        assert again is a
    a.dead = True  # its supervisor exited while idle: seen without a round trip
    with pool.sandbox() as b:
        assert b is not a and a.closed
    assert getattr(a, "pings", 0) == 0 and pool.stats["replaced"] == 1


def test_a_background_reset_is_waited_for_never_skipped():
    """With background resets a grade returns before its sandbox is reset; the next user of that
    configuration waits for the reset (no boot) and gets the sandbox only once it is clean."""
    import threading

    gate = threading.Event()

    class Slow(Fake):
        def reset(self):
            gate.wait(10)
            return super().reset()

    pool = ConfigPool(opener=Slow, background_reset=True)
    with pool.sandbox() as a:
        pass
    assert a.resets == 0 and pool.idle() == 0  # returned at once: the reset is still in flight
    threading.Timer(0.2, gate.set).start()
    with pool.sandbox() as again:
        assert again is a and a.resets == 1  # waited for it, then reused it
    assert pool.settle() and pool.stats["booted"] == 1
    gate.clear()
    with pool.sandbox() as b:
        b.reset_ok = False
    threading.Timer(0.2, gate.set).start()
    with pool.sandbox() as c:  # the reset in flight fails: not handed out, another boots
        assert c is not b and b.closed
    gate.set()
    pool.close()
    assert c.closed and pool.stats["discards"] == 1


@needs_bwrap
def test_copying_first_adds_little_to_the_graders_own_timeout(mode):
    import time

    mode("reset")
    with open_sandbox(Limits(wall_s=20)) as episode:
        episode.write_file("out.txt", "x")
        with grading.grading_context(Outcome(None, episode), include=["out.txt"]) as grader:
            t = time.monotonic()
            with pytest.raises(grading.GradingFailed, match="timeout"):
                grading.run_grader(grader, "import time; time.sleep(30)", {}, timeout=0.5, label="t")
            assert time.monotonic() - t < 0.5 + grading.COPY_S + 5  # not the copy's own 60 s
