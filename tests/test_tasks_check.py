"""check_domains catches every kind of broken domain, and the `posttrain tasks` CLI reports it."""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, replace

import pytest
from typer.testing import CliRunner

from posttrain.cli import app as root_app
from posttrain.scheduling.domain_check import check_domains
from posttrain.tasks.domain import Domain
from posttrain.values.task import Task
from posttrain.values.verdict import Verdict
from posttrain.verifiers.answer import EXACT
from posttrain.verifiers.base import VerifierError, verdict

runner = CliRunner()


def _good(name: str = "fake.ok", **changes) -> Domain:
    def generate(seed, split):
        return Task(domain=name, prompt=f"{seed}+1=", reference={"answer": str(seed + 1)}, split=split, seed=seed)

    base = Domain(name=name, family="fake", env="single", verifier=EXACT, generate=generate,
                  oracle=lambda t: [t.reference["answer"]],
                  negatives=lambda t: {"empty": [""], "wrong": [str(int(t.reference["answer"]) + 1)]})
    return replace(base, **changes)


@dataclass(frozen=True)
class _Raising:
    name: str = "raising"
    version: str = "1"
    needs_sandbox: bool = False

    def verify(self, task, outcome) -> Verdict:
        raise VerifierError("checker script crashed")


@dataclass
class _Flaky:
    name: str = "flaky"
    version: str = "1"
    needs_sandbox: bool = False

    def __post_init__(self):
        self.calls = itertools.count()

    def verify(self, task, outcome) -> Verdict:
        return verdict(self, next(self.calls) % 2 == 0 and outcome.answer == task.reference["answer"])


def _kinds(report) -> set[str]:
    return {f.kind for f in report.failures}


def test_a_good_domain_passes():
    report = check_domains([_good()], per_domain=4)
    assert report.ok and report.tasks == 4 and report.oracle_pass_rate == 1.0
    assert report.negative_fail_rate == 1.0 and report.flip_rate == 0.0
    assert report.checks[0].regraded == 4 * 3  # oracle and both negatives, twice each


def test_each_kind_of_breakage_is_reported():
    counter = itertools.count()
    broken = {
        "oracle_failed": _good(oracle=lambda t: ["nope"]),
        "negative_passed": _good(negatives=lambda t: {"empty": [""], "wrong": [t.reference["answer"]]}),
        "negatives_incomplete": _good(negatives=lambda t: {"empty": [""]}),
        "nondeterministic": _good(generate=lambda seed, split: Task(
            domain="fake.ok", prompt=str(next(counter)), reference={"answer": "1"}, split=split, seed=seed)),
        "generate_error": _good(generate=lambda seed, split: 1 / 0),
        "infra_error": _good(verifier=_Raising()),
        "flip": _good(verifier=_Flaky()),
    }
    for kind, domain in broken.items():
        report = check_domains([domain], per_domain=2)
        assert not report.ok and kind in _kinds(report), (kind, _kinds(report))
    infra = check_domains([broken["infra_error"]], per_domain=2)
    # an infrastructure failure is neither a pass nor a fail
    assert infra.checks[0].infra_errors == 6 and infra.checks[0].oracle_passed == 0
    assert infra.checks[0].negatives == 0 and infra.negative_fail_rate == 1.0
    assert "checker script crashed" in infra.failures[0].detail
    # a domain that only ever fails on infrastructure is not ground through all its tasks
    stopped = check_domains([broken["infra_error"]], per_domain=10)
    assert stopped.checks[0].tasks == 2 and "stopped" in stopped.failures[-1].detail


def test_two_workers_give_the_same_report_as_one():
    from posttrain.tasks import registry

    domains = registry.match_domains("math.add.*,text.sort.*")
    one = check_domains(domains, per_domain=3, workers=1)
    two = check_domains(domains + [_good()], per_domain=3, workers=2)  # _good is checked locally
    assert two.ok and [c.domain for c in two.checks] == [d.name for d in domains] + ["fake.ok"]
    assert [(c.tasks, c.oracle_passed, c.negatives_failed) for c in one.checks] == \
           [(c.tasks, c.oracle_passed, c.negatives_failed) for c in two.checks[:-1]]


def test_cli_list_json_and_family_filter():
    result = runner.invoke(root_app, ["tasks", "list", "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)["domains"]
    names = {r["name"] for r in rows}
    assert {"math.add.d1", "text.reverse.l3"} <= names
    row = next(r for r in rows if r["name"] == "math.add.d1")
    assert row == {"name": "math.add.d1", "family": "math", "env": "single", "verifier": "exact@1"}
    only_text = json.loads(runner.invoke(root_app, ["tasks", "list", "--family", "text", "--json"]).output)
    assert only_text["domains"] and {r["family"] for r in only_text["domains"]} == {"text"}
    bad = runner.invoke(root_app, ["tasks", "list", "--family", "nosuch"])
    assert bad.exit_code != 0 and "nosuch" in bad.output


def test_cli_show_prints_prompt_and_reference():
    result = runner.invoke(root_app, ["tasks", "show", "math.add.d2", "--seed", "3", "--split", "eval"])
    assert result.exit_code == 0, result.output
    from posttrain.tasks.registry import get_domain

    task = get_domain("math.add.d2").task(3, "eval")
    assert task.prompt in result.output and task.reference["answer"] in result.output
    as_json = json.loads(runner.invoke(root_app, ["tasks", "show", "text.sort.l3", "--json"]).output)
    assert as_json["domain"] == "text.sort.l3" and as_json["split"] == "train"
    unknown = runner.invoke(root_app, ["tasks", "show", "math.nosuch"])
    assert unknown.exit_code != 0 and "unknown domain" in unknown.output


def test_cli_check_json_and_exit_code():
    result = runner.invoke(root_app, ["tasks", "check", "--domains", "math.add.*,text.upper.*",
                                      "--per-domain", "2", "--workers", "1", "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    assert summary["domains"] == 8 and summary["tasks"] == 16 and summary["failures"] == []
    assert summary["oracle_pass_rate"] == 1.0 and summary["negative_fail_rate"] == 1.0
    assert summary["by_family"]["math"]["domains"] == 5 and summary["by_family"]["text"]["tasks"] == 6
    table = runner.invoke(root_app, ["tasks", "check", "--family", "text", "-d", "text.upper.*", "-n", "1"])
    assert table.exit_code == 0 and "text" in table.output and "3 domains" in table.output
    none = runner.invoke(root_app, ["tasks", "check", "--domains", "zzz.*"])
    assert none.exit_code != 0 and "no domain matches" in none.output


def test_a_sandboxed_domain_is_played_on_the_engine_and_its_infra_errors_are_counted():
    """A domain whose episodes need a sandbox is played as engine episodes: a sandbox that fails
    to start is each attempt's infrastructure error (with the original type and message and where
    it was raised), never a pass or a fail, and the domain is not ground through every task."""
    from posttrain.sandbox.base import SandboxError
    from posttrain.scheduling.domain_check import check_domain
    calls = []

    def failing_sandbox():
        calls.append(1)
        raise SandboxError("no sandbox today")

    @dataclass(frozen=True)
    class _RunsCode:
        name: str = "runs-code"
        version: str = "1"
        needs_sandbox: bool = True

        def verify(self, task, outcome, sandbox=None) -> Verdict:
            return verdict(self, outcome.answer == task.reference["answer"])

    domain = _good(name="fake.sandboxed", verifier=_RunsCode())
    check = check_domain(domain, per_domain=5, sandbox_factory=failing_sandbox)
    assert check.tasks == 2 and check.oracle_passed == 0 and check.negatives == 0 and check.hacks == 0
    assert check.infra_errors == 2 * 3 and len(calls) >= check.infra_errors
    infra = [f for f in check.failures if f.kind == "infra_error"]
    assert "SandboxError: no sandbox today (at " in infra[0].detail and "stopped" in infra[-1].detail
    assert {f.kind for f in check.failures} == {"infra_error", "hack_infra_error"}


def test_check_episodes_take_no_per_turn_snapshots(monkeypatch):
    """A self-check's tool episodes are graded, never branched from a turn: no workspace
    snapshot per turn (they cost an overlay copy each), and the checks still hold."""
    import pytest

    from posttrain.sandbox.bwrap import bwrap_problem
    from posttrain.sandbox.client import SupervisedSandbox
    from posttrain.scheduling.domain_check import check_domain
    from posttrain.tasks.registry import all_domains

    if bwrap_problem() is not None:
        pytest.skip(f"bubblewrap unavailable: {bwrap_problem()}")
    snapshots = []
    real = SupervisedSandbox.snapshot
    monkeypatch.setattr(SupervisedSandbox, "snapshot", lambda self: snapshots.append(1) or real(self))
    domain = next(d for n, d in sorted(all_domains().items()) if n.startswith("terminal.") and d.env == "tools")
    check = check_domain(domain, per_domain=1)
    assert check.tasks == 1 and check.oracle_passed == 1 and check.hacks > 0, check.failures
    assert not check.failures and snapshots == []


def test_tasks_graded_at_once_give_the_task_by_task_report():
    """Several tasks' batches in flight (an engine grader waits on sandboxes): generated and
    counted in sample order, so the report is the task-by-task one, given-up domains included."""
    import time
    from dataclasses import asdict

    from posttrain.tasks.check import check_with, grade_directly

    finished = []

    def slow_grade(domain, task, attempts):  # the later tasks' batches finish first
        time.sleep(0.04 * (6 - task.seed))
        finished.append(task.seed)
        return grade_directly(domain, task, attempts)

    def report(c):
        return {k: v for k, v in asdict(c).items() if k != "seconds"}

    for domain in (_good(), _good(verifier=_Raising()), _good(oracle=lambda t: ["nope"]),
                   _good(generate=lambda seed, split: 1 / 0)):
        finished.clear()
        one = check_with(domain, slow_grade, regrade_all=False, per_domain=6, tasks_at_once=1)
        assert finished == sorted(finished)
        finished.clear()
        three = check_with(domain, slow_grade, regrade_all=False, per_domain=6, tasks_at_once=3)
        assert report(three) == report(one), domain.verifier
        if domain.verifier.name != "raising" and one.tasks:
            assert finished != sorted(finished)  # they did overlap
    given_up = check_with(_good(verifier=_Raising()), slow_grade, regrade_all=False, per_domain=6,
                          tasks_at_once=3)
    assert given_up.tasks == 2 and "stopped" in given_up.failures[-1].detail


def test_domains_are_served_by_pools_preloaded_for_them_alone(monkeypatch):
    """Neighbouring domains with the same preloads share one episode pool; a domain that
    preloads other modules gets a pool of its own (a code episode's sandbox does not import
    geometry's modules), and the report keeps the domains' order."""
    from contextlib import contextmanager

    from posttrain.scheduling import domain_check

    opened: list[list[str]] = []

    @contextmanager
    def sandboxes(domains):
        opened.append([d.name for d in domains])
        yield f"pool{len(opened)}"

    served: dict[str, object] = {}

    def check_domain(domain, per_domain, seeds, factory=None, guess_tasks=0):
        served[domain.name] = factory
        return domain_check.DomainCheck(domain.name, domain.family, domain.env)

    monkeypatch.setattr(domain_check, "_sandboxes", sandboxes)
    monkeypatch.setattr(domain_check, "check_domain", check_domain)
    plain = [_good(name=f"fake.plain{i}") for i in range(3)]
    heavy = [_good(name=f"fake.heavy{i}", preload=("numpy",)) for i in range(2)]
    domains = [plain[0], plain[1], heavy[0], heavy[1], plain[2]]
    report = domain_check.check_domains(domains, per_domain=1)
    assert [c.domain for c in report.checks] == [d.name for d in domains]
    assert opened == [["fake.plain0", "fake.plain1"], ["fake.heavy0", "fake.heavy1"], ["fake.plain2"]]
    assert served == {"fake.plain0": "pool1", "fake.plain1": "pool1", "fake.heavy0": "pool2",
                      "fake.heavy1": "pool2", "fake.plain2": "pool3"}


def test_domains_graded_directly_are_checked_beside_the_sandboxed_ones(monkeypatch):
    """With one worker, the registered domains that need no sandbox are checked in one forked
    process while this one checks the sandboxed domains; the report keeps the domains' order.
    The constant-answer probe goes with the check (the plan): reasoning-gym's probes, minutes in
    all, run beside the sandboxed checks instead of after them."""
    import os

    from posttrain.envs import needs_sandbox
    from posttrain.scheduling import domain_check
    from posttrain.tasks.registry import all_domains

    def check_all(domains, plan):  # which process checked each domain, and with which plan
        return [domain_check.DomainCheck(d.name, d.family, d.env, not_checked=f"{os.getpid()} {plan}")
                for d in domains]

    monkeypatch.setattr(domain_check, "_check_all", check_all)
    registered = sorted(all_domains().items())
    direct = [d for n, d in registered if n.startswith("math.")][:2]
    boxed = [d for n, d in registered if n.startswith("code.")][:2]
    assert direct and boxed and not any(map(needs_sandbox, direct)) and all(map(needs_sandbox, boxed))
    domains = [direct[0], boxed[0], _good(), direct[1], boxed[1]]
    report = domain_check.check_domains(domains, per_domain=1, seeds=[3], guess_tasks=7)
    where = {c.domain: c.not_checked.split(" ", 1)[0] for c in report.checks}
    assert {c.not_checked.split(" ", 1)[1] for c in report.checks} == {
        str(domain_check._Plan(per_domain=1, seeds=[3], guess_tasks=7))}
    assert [c.domain for c in report.checks] == [d.name for d in domains]
    here = str(os.getpid())
    assert where[boxed[0].name] == where[boxed[1].name] == where["fake.ok"] == here  # unregistered: here
    assert where[direct[0].name] == where[direct[1].name] != here


def _skewed(name: str, zero_share_in_10: int) -> Domain:
    """Answers "0" for `zero_share_in_10` of every 10 seeds, else a spread of 1..9."""
    def generate(seed, split):
        answer = "0" if seed % 10 < zero_share_in_10 else str(1 + seed % 9)
        return Task(domain=name, prompt=f"task {seed}", reference={"answer": answer}, split=split, seed=seed)

    return _good(name, generate=generate)


def test_the_constant_answer_probe_flags_a_skewed_domain_and_the_cli_names_it():
    skewed, even = _skewed("fake.skewed", 5), _skewed("fake.even", 1)
    report = check_domains([skewed, even], per_domain=2, guess_tasks=100)
    assert report.ok  # guessable is a warning: every per-task check still passes
    guess = {c.domain: c.guess for c in report.checks}
    assert guess["fake.skewed"].answer == "0" and guess["fake.skewed"].rate == 0.5
    assert guess["fake.skewed"].chance == 0.1 and guess["fake.skewed"].guessable
    assert guess["fake.even"].rate <= 0.2 and not guess["fake.even"].guessable
    summary = report.summary()
    assert list(summary["guessable"]) == ["fake.skewed"]
    assert summary["guessable"]["fake.skewed"] == {"answer": "0", "rate": 0.5, "chance": 0.1}
    assert "guess" not in check_domains([skewed], per_domain=1).summary()["by_domain"]["fake.skewed"]  # off

    from posttrain.tasks import registry

    registry.add_domains([skewed, even], "test source")
    try:
        flagged = runner.invoke(root_app, ["tasks", "check", "-d", "fake.*", "-n", "1", "--guess-tasks", "60"])
        assert flagged.exit_code == 0, flagged.output
        assert "guessable fake.skewed" in flagged.output and "'0'" in flagged.output
        assert "fake.even" not in flagged.output.split("guessable", 1)[1]
        off = runner.invoke(root_app, ["tasks", "check", "-d", "fake.*", "-n", "1", "--guess-tasks", "0"])
        assert off.exit_code == 0 and "guessable" not in off.output
    finally:
        registry.reset_cache()


def test_the_probe_flags_splits_that_pay_a_constant_answer_differently():
    """A domain whose eval split answers "0" three times as often as its train split (the same
    answers otherwise): a prior learned in training would be rewarded by chance in evaluation."""
    def generate(seed, split):
        zero = seed % 10 < (6 if split == "eval" else 2)
        answer = "0" if zero else str(1 + seed % 9)
        return Task(domain="fake.shifted", prompt=f"task {seed} {split}", reference={"answer": answer},
                    split=split, seed=seed)

    shifted = _good("fake.shifted", generate=generate)
    even = _skewed("fake.even", 1)
    report = check_domains([shifted, even], per_domain=1, guess_tasks=200)
    assert report.ok  # a warning, like guessable
    guess = {c.domain: c.guess for c in report.checks}
    assert guess["fake.shifted"].splits_differ and guess["fake.shifted"].split_p < 1e-6
    assert not guess["fake.even"].splits_differ and guess["fake.even"].split_p > 0.5
    assert list(report.summary()["splits_differ"]) == ["fake.shifted"]

    from posttrain.tasks import registry

    registry.add_domains([shifted, even], "test source")
    try:
        out = runner.invoke(root_app, ["tasks", "check", "-d", "fake.*", "-n", "1", "--guess-tasks", "200"])
        assert out.exit_code == 0, out.output
        assert "splits differ fake.shifted" in out.output and "splits differ fake.even" not in out.output
    finally:
        registry.reset_cache()


@pytest.mark.slow
def test_no_generator_of_the_project_is_guessable_nor_has_splits_that_differ():
    """The constant-answer probe on every directly graded domain the project generates itself
    (reasoning-gym's skewed generators are thinned by their shipped answer caps: tested in
    test_family_rgym)."""
    from posttrain.envs import needs_sandbox
    from posttrain.tasks.guess import guess_probe
    from posttrain.tasks.registry import all_domains

    own = [d for n, d in sorted(all_domains().items()) if not n.startswith("rg.") and not needs_sandbox(d)]
    assert len(own) > 150
    guessable, differ = {}, {}
    for d in own:
        g = guess_probe(d, 200)
        if g is not None and g.guessable:
            guessable[d.name] = (g.answer, g.rate, round(g.chance, 3))
        if g is not None and g.splits_differ:
            differ[d.name] = g.split_p
    assert guessable == {}
    assert differ == {}  # their answer strata (common.strata_of)
