"""`tasks check` generates the checked tasks again in another process, on another day: a
generator that reads the clock or iterates over a set of strings fails as nondeterministic."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from posttrain.scheduling.domain_check import check_domains
from posttrain.tasks import elsewhere, registry

FAMILY = '''
import dataclasses
import datetime
import random
import time

from posttrain.tasks.domain import Domain
from posttrain.values.task import Task
from posttrain.verifiers.answer import EXACT


def _domain(name, extra):
    def generate(seed, split):
        rng = random.Random(f"{name}/{split}/{seed}")
        word = "".join(rng.choice("abcdefgh") for _ in range(3))
        return Task(domain=name, prompt=f"repeat {word} 2=", reference={"answer": word * 2, **extra()},
                    split=split, seed=seed)

    return Domain(name=name, family="clock", env="single", verifier=EXACT, generate=generate,
                  oracle=lambda t: [t.reference["answer"]],
                  negatives=lambda t: {"empty": [""], "wrong": [t.reference["answer"][:-1]]})


class DayGrader:
    """Passes the right answer only before a year that a policy cannot reach today but a
    re-score on another day does (what a grader that reads the clock does)."""

    name = "day"
    version = "1"
    needs_sandbox = False

    def verify(self, task, outcome):
        from posttrain.verifiers.base import verdict

        right = (outcome.answer or "").strip() == task.reference["answer"]
        return verdict(self, right and datetime.date.today().year < 2029)


def domains():
    graded = dataclasses.replace(_domain("clock.graded", dict), verifier=DayGrader())
    return [graded, _domain("clock.pure", dict),
            # what reasoning-gym's time_intervals did: today's date in the reference
            _domain("clock.today", lambda: {"made": str(datetime.date.today())}),
            # iteration order over a set of strings: PYTHONHASHSEED decides it
            _domain("clock.hashed", lambda: {"order": list({f"word{i}" for i in range(40)})}),
            # the local time zone's offset
            _domain("clock.zone", lambda: {"zone": time.strftime("%z")}),
            # a data file found through the working directory
            _domain("clock.cwd", lambda: {"data": open("clock-data.txt").read()})]
'''


@pytest.fixture
def clock_family(tmp_path, monkeypatch):
    """A third-party family installed as a plugin, visible to child processes too."""
    (tmp_path / "clock_family.py").write_text(FAMILY)
    dist = tmp_path / "clock_family-0.1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: clock_family\nVersion: 0.1.0\n")
    (dist / "entry_points.txt").write_text("[posttrain.families]\nclock = clock_family:domains\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path) + ":" + ":".join(p for p in sys.path if p))
    registry.reset_cache()
    yield
    registry.reset_cache()
    sys.modules.pop("clock_family", None)


def test_a_generator_that_reads_the_clock_or_a_set_order_fails_the_check(clock_family, tmp_path, monkeypatch):
    (tmp_path / "clock-data.txt").write_text("found")
    monkeypatch.chdir(tmp_path)
    report = check_domains(registry.match_domains("clock.*"), per_domain=3)
    failed = {(f.domain, f.kind) for f in report.failures}
    assert failed == {(f"clock.{name}", "nondeterministic")
                      for name in ("today", "hashed", "zone", "cwd", "graded")}, failed
    [graded] = [f for f in report.failures if f.domain == "clock.graded"][:1]
    assert "the same task grades otherwise" in graded.detail and "oracle=True/1 " in graded.detail
    assert "oracle=False/0 " in graded.detail
    [today] = [f for f in report.failures if f.domain == "clock.today"][:1]
    assert "another process on another day" in today.detail and "reads the clock" in today.detail
    [cwd] = [f for f in report.failures if f.domain == "clock.cwd"][:1]
    assert "failed: FileNotFoundError" in cwd.detail and "another working directory" in cwd.detail
    # every sampled task of the clock domain differs; within one process it never did
    assert sum(f.domain == "clock.today" for f in report.failures) == 3
    assert not report.ok
    # without the second process, the within-process check passes them all
    assert check_domains(registry.match_domains("clock.*"), per_domain=3, elsewhere=False).ok


def test_a_domain_the_child_does_not_know_is_skipped_and_a_dead_child_is_infrastructure(clock_family, monkeypatch):
    from posttrain.tasks.domain import Domain

    pure = registry.get_domain("clock.pure")
    local = Domain(name="local.only", family="local", env="single", verifier=pure.verifier,
                   generate=lambda seed, split: pure.generate(seed, split).model_copy(update={"domain": "local.only"}),
                   oracle=pure.oracle, negatives=pure.negatives)
    assert check_domains([local, pure], per_domain=2).ok
    monkeypatch.setattr(elsewhere, "HASH_SEED", "not a number")  # the child cannot start Python
    report = check_domains([pure], per_domain=2)
    [failure] = report.failures
    assert failure.kind == "infra_error" and "exited" in failure.detail and not report.ok


@pytest.mark.slow
def test_every_shipped_domain_generates_the_same_tasks_elsewhere():
    """The registry's own domains, seeds 0 and 1 of both splits, generated again in a child with
    another hash seed, time zone, working directory and day (Ray workers, resumed runs and
    replays regenerate tasks elsewhere, later), and the directly graded ones' oracle and
    negatives graded there: the same tasks, the same verdicts."""
    from posttrain.envs import needs_sandbox

    domains = list(registry.all_domains().values())
    specs = [(d.name, seed, split) for d in domains for seed in (0, 1) for split in ("train", "eval")]
    graded = {d.name for d in domains if not needs_sandbox(d)}  # their verdicts compared too
    child = elsewhere.Elsewhere(specs, graded=graded)
    theirs = child.hashes()
    assert len({name for name, _, _ in theirs}) == len(domains) >= 300 and len(graded) >= 200
    assert sum(elsewhere.VERDICTS in h for h in theirs.values()) >= 4 * 200
    assert not [h for h in theirs.values() if "=error:" in h]  # every verdict made, none skipped
    assert elsewhere.differences(domains, theirs, specs, graded) == []


KILLED = """
import os, signal, sys, time
from posttrain.tasks import elsewhere
from posttrain.tasks.registry import all_domains
specs = [(n, s, "train") for n in all_domains() for s in range(50)]
child = elsewhere.Elsewhere(specs)
print(child._proc.pid, flush=True)
time.sleep(1.0)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_the_child_dies_with_a_checker_killed_outright():
    import subprocess

    p = subprocess.run([sys.executable, "-c", KILLED], capture_output=True, text=True, timeout=120)
    assert p.returncode == -9, p.stderr
    pid = int(p.stdout.split()[0])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
        if Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z":
            break
        time.sleep(0.1)
    alive = Path(f"/proc/{pid}").exists() and Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    assert not alive, "the child generated on after its checker was killed"
