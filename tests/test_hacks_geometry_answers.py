"""Hack classes against the geometry, reasoning-gym and JSON-answer graders, and the self-check
that plays them (`hack_pass_rate`)."""

from __future__ import annotations

import pytest

from posttrain.envs import play_actions
from posttrain.sandbox import open_sandbox
from posttrain.scheduling.domain_check import check_domain
from posttrain.tasks.adversaries import adversaries
from posttrain.tasks.domain import Domain
from posttrain.tasks.families.geometry.common import PRELOAD
from posttrain.tasks.registry import all_domains
from posttrain.values.task import Task
from posttrain.verifiers.base import Outcome, verdict

DOMAINS = all_domains()


@pytest.fixture(scope="module")
def sandbox():
    with open_sandbox(preload=PRELOAD) as sb:  # ptgeo.py, the modeling API, among them
        yield sb


@pytest.mark.parametrize("name", ["geometry.script.cylinder.dims", "geometry.shape.cylinder.dims"])
@pytest.mark.parametrize("hack", ["marker-parts", "stray-vertices", "nan-vertices"])
def test_geometry_bounding_box_hacks_fail(name, hack, sandbox):
    # a box of the right volume, its bounding box stretched to the asked one by tiny marker parts
    # or by vertices no triangle uses, used to pass every check of a cylinder task
    env = "single" if "script" in name else "tools"
    d = DOMAINS.get(name) or next(d for n, d in DOMAINS.items() if n.startswith("geometry.")
                                  and n.endswith("cylinder.dims") and d.env == env)
    task = d.task(0)
    attempt = adversaries(d, task)[hack]
    v = play_actions(d, task, attempt, sandbox=sandbox) if d.env == "tools" else \
        d.verifier.verify(task, Outcome(answer=attempt[-1], sandbox=sandbox))
    assert not v.passed, (hack, dict(v.details))
    assert play_actions(d, task, d.oracle(task), sandbox=sandbox).passed


def test_geometry_reference_is_built_once_per_script_and_hacks_still_fail(sandbox, monkeypatch):
    """The reference model is built once per oracle script (then reused from memory), and a
    grade with the reused reference still fails a marker-part hack and passes the oracle; a
    different script (another task) builds its own."""
    from posttrain.verifiers import geometry

    monkeypatch.setattr(geometry, "_references", type(geometry._references)())
    builds = []
    real = geometry.run_grader

    def counting(sb, program, payload, **kw):
        if program is geometry.REFERENCE:
            builds.append(payload["reference"])
        return real(sb, program, payload, **kw)

    monkeypatch.setattr(geometry, "run_grader", counting)
    d = DOMAINS["geometry.cylinder.dims"]
    task = d.task(0)
    assert play_actions(d, task, d.oracle(task), sandbox=sandbox).passed
    sandbox.run("rm -rf ./* /tmp/*")
    v = play_actions(d, task, adversaries(d, task)["marker-parts"], sandbox=sandbox)
    assert not v.passed and any(f["check"] == "same_shape" for f in v.details["failed"]), dict(v.details)
    assert builds == [task.reference["oracle"]]  # one build for both grades
    other = d.task(1)
    assert other.reference["oracle"] != task.reference["oracle"]
    sandbox.run("rm -rf ./* /tmp/*")
    assert play_actions(d, other, d.oracle(other), sandbox=sandbox).passed
    assert builds == [task.reference["oracle"], other.reference["oracle"]]


def test_geometry_reference_cache_is_bounded_and_keyed_by_script(monkeypatch):
    import contextlib

    from posttrain.verifiers import geometry

    monkeypatch.setattr(geometry, "_references", type(geometry._references)())
    monkeypatch.setattr(geometry, "REFERENCE_CACHE_BYTES", 250)
    monkeypatch.setattr(geometry, "grading_sandbox", lambda *a, **k: contextlib.nullcontext())
    built = []

    def build(sb, program, payload, **kw):
        built.append(payload["reference"])
        return {"model": payload["reference"] * 100}

    monkeypatch.setattr(geometry, "run_grader", build)
    for script in ("a", "b", "a", "c", "a", "b"):
        assert geometry.reference_model(script, "m.json", None, "t") == script * 100
    # two fit in 250 bytes: "a" kept (recently used), "b" dropped for "c", then built again
    assert built == ["a", "b", "c", "b"]
    assert geometry.reference_model("a", "other.json", None, "t") and built[-1] == "a"  # the file is in the key


def test_geometry_reference_graded_at_once_is_built_once(monkeypatch):
    """A check grades a task's oracle, negatives and hacks at the same time: the grades that
    miss the cache together wait for one build (they used to build it once each), and a failed
    build is not remembered (the next grade builds it again)."""
    import contextlib
    import threading
    import time

    from posttrain.verifiers import geometry

    monkeypatch.setattr(geometry, "_references", type(geometry._references)())
    monkeypatch.setattr(geometry, "grading_sandbox", lambda *a, **k: contextlib.nullcontext())
    built, fail = [], [True]

    def build(sb, program, payload, **kw):
        built.append(payload["reference"])
        time.sleep(0.05)  # long enough for every other grade to miss the cache meanwhile
        if payload["reference"] == "bad" and fail[0]:
            fail[0] = False
            return {"error": "the sandbox broke"}
        return {"model": payload["reference"] * 2}

    monkeypatch.setattr(geometry, "run_grader", build)
    got: list = []

    def grade(script):
        try:
            got.append(geometry.reference_model(script, "m.json", None, "t"))
        except geometry.VerifierError as e:
            got.append(e)

    threads = [threading.Thread(target=grade, args=(s,)) for s in ["a"] * 6 + ["b"] * 3]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(built) == ["a", "b"] and sorted(map(str, got)) == ["aa"] * 6 + ["bb"] * 3
    got.clear()
    threads = [threading.Thread(target=grade, args=("bad",)) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert built.count("bad") == 2, built  # the failure, then one build for the two that waited
    assert sum(isinstance(g, geometry.VerifierError) for g in got) == 1 and got.count("badbad") == 2
    assert not geometry._building


@pytest.mark.parametrize("answer", ["nan", "NaN", "inf", "-Infinity", "[nan]"])
def test_non_finite_answers_fail_before_any_rg_scorer(answer):
    for name in ("rg.basic_arithmetic", "rg.decimal_arithmetic", "rg.gsm_symbolic"):
        d = DOMAINS[name]
        v = d.verifier.verify(d.task(0), Outcome(answer=answer))
        assert not v.passed, name


def test_rg_lenient_and_raising_scorers():
    d = DOMAINS["rg.gsm_symbolic"]
    task = d.task(0)
    right = task.reference["answer"]
    assert not d.verifier.verify(task, Outcome(answer=f"{right} or maybe 7")).passed
    assert d.verifier.verify(task, Outcome(answer=right)).passed
    d = DOMAINS["rg.prime_factorization"]  # its scorer raises on non-numbers: a failure, not infra
    v = d.verifier.verify(d.task(0), Outcome(answer="x"))
    assert not v.passed and "rejected" in v.details["reason"]


def test_docs_json_compares_scalars_by_type():
    d = next(d for n, d in sorted(DOMAINS.items()) if n.startswith("docs.")
             and any(k.startswith("json-") for k in adversaries(d, d.task(0))))
    task = d.task(0)
    for name, actions in adversaries(d, task).items():
        assert not d.verifier.verify(task, Outcome(answer=actions[-1])).passed, name


class _Gullible:
    name, version, needs_sandbox = "gullible", "1", False

    def verify(self, task, outcome):
        return verdict(self, "42" in (outcome.answer or "") or outcome.answer == "x")


def _say_42(verifier) -> Domain:
    """A toy domain whose answer is 42, graded by `verifier`."""
    name = f"toy.{verifier.name}"

    def gen(seed, split):
        return Task(domain=name, prompt="say 42", env="single", split=split, seed=seed,
                    reference={"answer": "42"})

    return Domain(name=name, family="toy", env="single", verifier=verifier, generate=gen,
                  oracle=lambda t: ["42"], negatives=lambda t: {"empty": [""], "wrong": ["41"]})


def test_tasks_check_reports_hack_pass_rate_and_fails_a_gameable_domain():
    c = check_domain(_say_42(_Gullible()), per_domain=2)
    assert c.hacks > 0 and c.hacks_passed >= 2  # "garbage" (x) passes on both tasks
    assert any(f.kind == "hack_passed" for f in c.failures)


class _Evaluating:
    """A grader that evaluates the answer as Python (as some reasoning-gym scorers did)."""
    name, version, needs_sandbox = "evaluating", "1", False

    def verify(self, task, outcome):
        if "**" in (outcome.answer or ""):  # the time-bomb probe would hang this test
            return verdict(self, False)
        try:
            value = eval(outcome.answer or "")  # noqa: S307 - the fault under test
        except Exception:
            value = None
        return verdict(self, value == 42)


def test_tasks_check_catches_a_grader_that_runs_the_answer_as_code():
    c = check_domain(_say_42(_Evaluating()), per_domain=1)
    ran = [f for f in c.failures if f.kind == "hack_code_ran"]
    assert {f.detail.split("'")[1] for f in ran} == {"eval-import", "eval-open", "eval-lambda"}
    assert c.hacks_passed >= 3 and not any(f.kind == "hack_passed" for f in c.failures)
