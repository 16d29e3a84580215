"""Harbor conformance, the kernel: image sandboxes and builds need overlayfs over idmapped
layers (Linux >= 5.19). On an older kernel they fail up front with a message naming the
kernel's version and the feature (tested by faking the version), never later in a mount."""

from __future__ import annotations

import os

import pytest

from posttrain.sandbox import idmap

FAKE = os.uname_result(("Linux", "host", "5.15.0-91-generic", "#1 SMP", "x86_64"))


@pytest.mark.parametrize("release, refused", [
    ("5.15.0-91-generic", True), ("4.19.0", True), ("5.18.19", True), ("5.19.0", False),
    ("6.1.0-18-amd64", False), ("6.18.44-fc-v857", False), ("10.0", False), ("weird", False)])
def test_the_version_rule(release, refused):
    problem = idmap.kernel_problem(release)
    if refused:
        assert problem is not None and release in problem and "Linux >= 5.19" in problem
        assert "overlayfs over idmapped layers" in problem
    else:
        assert problem is None


def test_image_sandboxes_and_builds_refuse_an_old_kernel_by_name(monkeypatch, tmp_path):
    from posttrain.images.build import BuildError, build
    from posttrain.images.store import CACHE_ENV
    from posttrain.sandbox import open_sandbox
    from posttrain.sandbox.base import SandboxUnavailable

    monkeypatch.setattr(idmap.os, "uname", lambda: FAKE)
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    with pytest.raises(SandboxUnavailable, match=r"Linux >= 5\.19 for overlayfs over idmapped "
                                                 r"layers.*this kernel is 5\.15\.0-91-generic"):
        open_sandbox(image={"digest": "x", "layers": [], "workdir": "/"})
    (tmp_path / "Dockerfile").write_text("FROM python:3.11-slim\nRUN true\n")
    with pytest.raises(BuildError, match=r"Dockerfile: cannot build here: .*this kernel is 5\.15\.0"):
        build(tmp_path / "Dockerfile")
    assert not (tmp_path / "cache" / "layers").exists() or not list((tmp_path / "cache" / "layers").iterdir())


def test_an_episode_over_an_image_on_an_old_kernel_is_an_infrastructure_error(monkeypatch, tmp_path):
    """Not a reward of 0: the episode's trajectory is an infra_error naming the kernel."""
    from posttrain.envs import default_sandbox_factory
    from posttrain.rollout.episode import Episode
    from posttrain.tasks.families.terminal.harbor import load_harbor_task
    from posttrain.values.generation import Completion

    folder = tmp_path / "old-kernel"
    for rel, text in {"instruction.md": "Do nothing.\n", "task.toml": "[metadata]\nsplit = 'train'\n",
                      "environment/Dockerfile": "FROM python:3.11-slim\nWORKDIR /app\n",
                      "tests/test.sh": "echo 1 > /logs/verifier/reward.txt\n",
                      "solution/solve.sh": "true\n"}.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(text)
    domain = load_harbor_task(folder)
    monkeypatch.setattr(idmap.os, "uname", lambda: FAKE)
    ep = Episode(domain, domain.task(0, "train"), policy_version="v",
                 sandbox_factory=default_sandbox_factory())
    req = ep.start()
    while req is not None:
        req = ep.advance(Completion(text="<submit></submit>", finish_reason="stop"))
    traj = ep.result().trajectory
    assert traj.status == "infra_error" and traj.error is not None
    assert "5.15.0-91-generic" in traj.error.message and "5.19" in traj.error.message
