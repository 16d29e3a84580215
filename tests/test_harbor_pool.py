"""Harbor conformance, pooled image sandboxes: episodes over a built image reuse a booted
sandbox reset to pristine, and nothing one episode did as root (a file under /etc, a program in
/usr/local/bin, a daemon, a user added with useradd, a changed input file) reaches the next one
in the same sandbox; the image's service is running again."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from posttrain.sandbox.bwrap import bwrap_problem

PROBLEM = bwrap_problem()
pytestmark = pytest.mark.skipif(PROBLEM is not None, reason=f"bubblewrap unavailable: {PROBLEM}")

FOLDER = {
    "instruction.md": "Look around.\n",
    "task.toml": "[metadata]\nsplit = 'train'\n",
    "environment/Dockerfile": "FROM debian:12\nWORKDIR /app\nCOPY seed.txt ./\n"
                              "CMD [\"sleep\", \"infinity\"]\n",
    "environment/seed.txt": "pristine\n",
    "tests/test.sh": "echo 1 > /logs/verifier/reward.txt\n",
    "solution/solve.sh": "true\n",
}
LEAK = ("useradd -m bob && echo x > /etc/leak && echo y > /usr/local/bin/leak && "
        "echo z > /var/log/leak && echo changed > seed.txt && touch new.txt /tmp/t /dev/shm/s && "
        "(setsid sh -c 'while true; do sleep 1; done' > /dev/null 2>&1 &) && "
        "(nohup sleep 1234 > /dev/null 2>&1 &) && pkill -f '[s]leep infinity'")
LOOK = ("ls /etc/leak /usr/local/bin/leak /var/log/leak /home/bob new.txt /tmp/t /dev/shm/s 2>&1; "
        "id bob 2>&1; grep -c bob /etc/passwd; cat seed.txt; ps -eo args")


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    from posttrain.images.episode import close_episode_pool
    from posttrain.images.store import CACHE_ENV
    from posttrain.tasks.families.terminal.harbor import load_harbor_task

    old = os.environ.get(CACHE_ENV)
    os.environ[CACHE_ENV] = str(tmp_path_factory.mktemp("image-cache"))
    folder = tmp_path_factory.mktemp("tasks") / "pooled"
    for rel, text in FOLDER.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(text)
    close_episode_pool()
    yield load_harbor_task(Path(folder)).task(0, "train")
    close_episode_pool()
    if old is None:
        os.environ.pop(CACHE_ENV, None)
    else:
        os.environ[CACHE_ENV] = old


def _sh(sb, command: str) -> str:
    return sb.run(["/bin/bash", "-c", command]).stdout


@pytest.mark.timeout(300)
def test_an_episode_leaves_nothing_in_the_pooled_sandbox(task):
    from posttrain.images.episode import episode_pool, task_sandbox

    with task_sandbox(task) as sb:
        first = sb.id
        _sh(sb, LEAK)
        seen = _sh(sb, "sleep 0.2; ps -eo args")
        assert "sleep 1234" in seen and "while true" in seen and "sleep infinity" not in seen
        assert "bob" in _sh(sb, "getent passwd bob")
    with task_sandbox(task) as sb:
        assert sb.id == first  # the same booted sandbox, reset
        out = _sh(sb, "sleep 0.3; " + LOOK)
    assert out.count("No such file") == 7, out
    assert "no such user" in out and "\n0\npristine\n" in out, out
    assert "sleep 1234" not in out and "while true" not in out, out
    assert "sleep infinity" in out  # the image's service runs again
    stats = episode_pool().stats
    assert stats["booted"] == 1 and stats["reused"] == 1 and stats["discards"] == 0, stats


@pytest.mark.timeout(300)
def test_tool_episodes_take_pooled_sandboxes_and_fresh_mode_does_not(task, monkeypatch):
    from posttrain.envs import make_env
    from posttrain.images.episode import IMAGE_SANDBOXES_ENV, episode_pool, task_sandbox
    from posttrain.tasks.domain import Domain
    from posttrain.tasks.families.terminal.harbor import HARBOR

    domain = Domain(name=task.domain, family="terminal", env="tools", verifier=HARBOR,
                    generate=lambda seed, split: task, oracle=lambda t: [], negatives=lambda t: {})
    env = make_env(domain)
    ids = []
    try:
        for _ in range(2):
            env.reset(task)
            ids.append(env.sandbox.id)
            env.step("<bash>echo leaked > /etc/motd2; echo changed > seed.txt</bash>")
            env.close()
    finally:
        env.close()
    assert ids[0] == ids[1]
    with task_sandbox(task) as sb:
        assert _sh(sb, "cat seed.txt; ls /etc/motd2 2>&1") == \
            "pristine\nls: cannot access '/etc/motd2': No such file or directory\n"
    before = dict(episode_pool().stats)
    monkeypatch.setenv(IMAGE_SANDBOXES_ENV, "fresh")
    with task_sandbox(task) as sb:
        assert sb.id not in ids
    assert episode_pool().stats["reused"] == before["reused"]
    monkeypatch.setenv(IMAGE_SANDBOXES_ENV, "recycled")
    with pytest.raises(ValueError, match="POSTTRAIN_IMAGE_SANDBOXES='recycled': must be one of"):
        with task_sandbox(task):
            pass
