"""Verifier noise: flips measured per domain, noisy tasks quarantined, infra errors kept apart."""

import itertools
import json

import pytest
from typer.testing import CliRunner

from posttrain.cli import app as root_app
from posttrain.evaluation.noise import load_quarantine, measure_noise, update_quarantine, write_noise
from posttrain.policies.scripted import ScriptedPolicy
from posttrain.scheduling.engine import run_episodes
from posttrain.storage.store import Store
from posttrain.verifiers.base import VerifierError, verdict
from tests.toydomains import ExactVerifier, add_domain

runner = CliRunner()


class FlakyVerifier(ExactVerifier):
    """Right on the first call, then wrong on every other call (a verifier with a race)."""

    name = "toy-flaky"

    def __init__(self) -> None:
        self.calls = itertools.count()

    def verify(self, task, outcome):
        good = super().verify(task, outcome)
        n = next(self.calls)
        return good if n == 0 or n % 2 == 0 else verdict(self, not good.passed, reason="race")


class DiesAfterFirst(ExactVerifier):
    name = "toy-dies"

    def __init__(self) -> None:
        self.calls = itertools.count()

    def verify(self, task, outcome):
        if next(self.calls) > 0:
            raise VerifierError("checker crashed")
        return super().verify(task, outcome)


@pytest.fixture
def run_dir(tmp_path, toy_registry):
    stable, flaky, dies = add_domain("toy.stable"), add_domain("toy.flaky", FlakyVerifier()), \
        add_domain("toy.dies", DiesAfterFirst())
    toy_registry(stable, flaky, dies)
    specs = [(stable, stable.task(i)) for i in range(4)] + [(flaky, flaky.task(0))] + [(dies, dies.task(0))]
    policy = ScriptedPolicy.named("oracle")
    with Store.for_run_dir(tmp_path) as store:
        for (_d, t), traj in zip(specs, run_episodes(specs, policy, run_id="train-1")):
            store.put_trajectory(traj, t)
    return tmp_path, flaky.task(0).hash


def test_flips_per_domain_and_quarantine(run_dir):
    path, flaky_hash = run_dir
    with Store.for_run_dir(path) as store:
        report = measure_noise(store, k=3)
        noise_verdicts = [v for t in store.trajectories(domain="toy.flaky") for v in store.verdicts(t.id)
                          if v["kind"] == "noise"]
    domains = report.by_domain()
    assert domains["toy.stable"] == {"trajectories": 4, "flipped": 0, "infra_errors": 0, "tasks": 4,
                                     "noisy_tasks": 0, "flip_rate": 0.0}
    assert domains["toy.flaky"]["flipped"] == 1 and domains["toy.flaky"]["flip_rate"] == 1.0
    # a verifier crash on re-verification is infrastructure: counted, never a flip
    assert domains["toy.dies"]["infra_errors"] == 3 and domains["toy.dies"]["trajectories"] == 0
    assert [t.hash for t in report.noisy] == [flaky_hash]
    assert len(noise_verdicts) == 3 and {v["passed"] for v in noise_verdicts} == {True, False}
    update_quarantine(path, report)
    assert load_quarantine(path) == {flaky_hash}
    write_noise(path, report)
    saved = json.loads((path / "noise.json").read_text())
    assert saved["flipped"] == 1 and saved["noisy_tasks"][0]["domain"] == "toy.flaky"


def test_quarantine_only_grows_and_bad_files_are_named(run_dir, tmp_path_factory):
    path, flaky_hash = run_dir
    with Store.for_run_dir(path) as store:
        update_quarantine(path, measure_noise(store, k=2))
        update_quarantine(path, measure_noise(store, k=1, domains="toy.stable"))  # sees no flip
    assert load_quarantine(path) == {flaky_hash}
    assert load_quarantine(tmp_path_factory.mktemp("empty")) == set()
    (path / "quarantine.json").write_text("{oops")
    with pytest.raises(ValueError, match="quarantine.json: not JSON"):
        load_quarantine(path)
    with Store.for_run_dir(path) as store, pytest.raises(ValueError, match="k >= 1"):
        measure_noise(store, k=0)


def test_cli_noise(run_dir):
    path, flaky_hash = run_dir
    res = runner.invoke(root_app, ["tasks", "noise", str(path), "--k", "2", "--json"])
    assert res.exit_code == 0, res.output
    body = json.loads(res.output)
    assert body["domains"]["toy.flaky"]["flipped"] == 1 and body["noisy_tasks"][0]["hash"] == flaky_hash
    assert load_quarantine(path) == {flaky_hash}
    res = runner.invoke(root_app, ["tasks", "noise", str(path / "nothing")])
    assert res.exit_code == 2 and "no store.sqlite" in res.output
