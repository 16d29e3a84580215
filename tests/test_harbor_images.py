"""Harbor conformance: Dockerfiles built without Docker and run as written.

Every instruction posttrain honours (FROM, ARG, ENV, SHELL, RUN, WORKDIR, COPY/ADD, USER,
EXPOSE, LABEL, CMD), byte/mode/symlink/empty-directory fidelity, root inside a user namespace
(writes to /etc, /usr, /home that vanish with the sandbox), services started before the first
turn and after a reset, the layer cache, build errors that name the line, and the abuse suite
run in an image sandbox as root. (What a Dockerfile cannot do is refused at load:
`tests/test_harbor.py`.)"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from posttrain.sandbox.bwrap import bwrap_problem

PROBLEM = bwrap_problem()
pytestmark = pytest.mark.skipif(PROBLEM is not None, reason=f"bubblewrap unavailable: {PROBLEM}")

CONFORMANCE = """\
# syntax=docker/dockerfile:1
FROM python:3.11-slim
ARG GREETING=hello
ENV APP_MODE=test \\
    GREETING_COPY=${GREETING}-world
SHELL ["/bin/bash", "-c"]
RUN [[ -n "$BASH_VERSION" ]] && useradd -m -s /bin/bash alice \\
    && echo "$GREETING" > /etc/greeting \\
    && install -m 0755 /dev/null /usr/local/bin/tool && mkdir -p /var/log/app
WORKDIR /app
COPY --chown=alice:alice data/ ./data/
COPY bin/prog tools/
COPY --chmod=0640 notes.txt /srv/notes.txt
ADD extra* /opt/extra/
RUN chmod 4755 /app/tools/prog && chmod 2775 /app/data/empty && id -u > /app/built_as
USER alice
RUN id -un > /home/alice/whoami && touch /app/data/by_alice
EXPOSE 9000
LABEL org.example.kind=conformance
CMD ["python3", "-m", "http.server", "9000", "--bind", "127.0.0.1"]
"""
BINARY = bytes(range(256)) * 3


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    from posttrain.images.store import CACHE_ENV

    old = os.environ.get(CACHE_ENV)
    os.environ[CACHE_ENV] = str(tmp_path_factory.mktemp("image-cache"))
    yield Path(os.environ[CACHE_ENV])
    if old is None:
        os.environ.pop(CACHE_ENV, None)
    else:
        os.environ[CACHE_ENV] = old


def _context(root: Path, dockerfile: str, files: dict | None = None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "Dockerfile").write_text(dockerfile)
    for rel, data in (files or {}).items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data if isinstance(data, bytes) else data.encode())
    return root / "Dockerfile"


@pytest.fixture(scope="module")
def conformance(cache, tmp_path_factory):
    from posttrain.images.build import build

    root = tmp_path_factory.mktemp("conformance")
    path = _context(root, CONFORMANCE, {"data/bin.bin": BINARY, "data/.hidden": "h",
                                        "data/ignored.txt": "no", "bin/prog": "#!/bin/sh\necho prog\n",
                                        "notes.txt": "n", "extra1.txt": "1", "extra2.txt": "2",
                                        ".dockerignore": "# not copied\ndata/ignored.txt\n"})
    (root / "data" / "empty").mkdir()
    (root / "data" / "link").symlink_to("bin.bin")
    os.chmod(root / "bin" / "prog", 0o755)
    t0 = time.monotonic()
    image = build(path)
    return image, path, time.monotonic() - t0


def _sh(sb, command: str) -> str:
    r = sb.run(["/bin/bash", "-c", command])
    assert r.exit_code == 0, (command, r.stdout, r.stderr)
    return r.stdout


def test_every_supported_instruction_is_honoured(conformance):
    from posttrain.sandbox import Limits, open_sandbox

    image, _, _ = conformance
    assert image.user == "alice" and image.workdir == "/app" and image.exposed == ["9000"]
    assert image.labels == {"org.example.kind": "conformance"}
    with open_sandbox(Limits(wall_s=30), image=image.sandbox_config()) as sb:
        assert _sh(sb, "id -un; pwd") == "alice\n/app\n"  # USER, WORKDIR
        assert _sh(sb, 'echo "$APP_MODE $GREETING_COPY ${GREETING:-unset}"') == "test hello-world unset\n"
        assert _sh(sb, "cat /etc/greeting /home/alice/whoami /app/built_as") == "hello\nalice\n0\n"
        assert _sh(sb, "stat -c '%a %U' /usr/local/bin/tool /srv/notes.txt; ls -d /var/log/app") == \
            "755 root\n640 root\n/var/log/app\n"
        assert _sh(sb, "cat /opt/extra/extra1.txt /opt/extra/extra2.txt") == "12"
        assert _sh(sb, "tools/prog") == "prog\n"
        # the service (CMD) runs before the first command
        fetch = ("python3 - <<'EOF'\nimport time, urllib.request\nfor _ in range(100):\n"
                 "    try:\n        print(urllib.request.urlopen('http://127.0.0.1:9000/data/',"
                 " timeout=1).status); break\n    except OSError:\n        time.sleep(0.1)\nEOF")
        assert _sh(sb, fetch) == "200\n"


def test_files_round_trip_exactly(conformance):
    from posttrain.sandbox import Limits, open_sandbox

    image, _, _ = conformance
    with open_sandbox(Limits(wall_s=30), image=image.sandbox_config()) as sb:
        assert sb.read_file("data/bin.bin") == BINARY  # binary, through the workspace API too
        modes = _sh(sb, "stat -c '%n %a %U:%G %F' data data/empty tools/prog data/link "
                        "data/.hidden data/by_alice")
        assert modes.splitlines() == [
            "data 755 alice:alice directory", "data/empty 2775 alice:alice directory",
            "tools/prog 4755 root:root regular file", "data/link 777 alice:alice symbolic link",
            "data/.hidden 644 alice:alice regular file", "data/by_alice 644 alice:alice regular empty file"]
        assert _sh(sb, "readlink data/link; ls -A data/empty | wc -l; ls data") == \
            "bin.bin\n0\nbin.bin\nby_alice\nempty\nlink\n"  # .dockerignore'd file absent


def test_root_inside_a_user_namespace_nobody_outside(conformance):
    from posttrain.sandbox import Limits, open_sandbox
    from posttrain.sandbox.slots import RANGE_UID_BASE

    image, _, _ = conformance
    cfg = dict(image.sandbox_config(), uid=0, gid=0, home="/root")
    marker = f"posttrain-{os.getpid()}"
    with open_sandbox(Limits(wall_s=60), image=cfg) as sb:
        assert sb.host_uid >= RANGE_UID_BASE and sb.host_uid_count == 65536
        out = _sh(sb, f"id -u; useradd -m bob && id -u bob && ls -ld /home/bob | cut -d' ' -f3; "
                      f"echo x > /etc/{marker}; echo y > /usr/local/bin/{marker}; "
                      f"echo z > /var/log/{marker}; chown bob /var/log/{marker}; "
                      f"stat -c %U /var/log/{marker}")
        assert out.split() == ["0", "1001", "bob", "bob"]
        assert not os.path.exists(f"/etc/{marker}") and not os.path.exists(f"/usr/local/bin/{marker}")
        report = sb.reset()
        assert report.reusable, report.reason
        assert _sh(sb, f"ls /etc/{marker} /home/bob 2>&1; id bob 2>&1; true").count("No such") == 2
    with open_sandbox(Limits(wall_s=30), image=cfg) as fresh:
        assert "bob" not in _sh(fresh, "cat /etc/passwd")


def test_reset_restarts_the_service_and_drops_the_episode(conformance):
    from posttrain.sandbox import Limits, open_sandbox

    image, _, _ = conformance
    with open_sandbox(Limits(wall_s=30), image=image.sandbox_config()) as sb:
        _sh(sb, "pkill -f '[h]ttp[.]server'; echo junk > data/junk; touch /tmp/t")
        assert sb.reset().reusable
        assert "junk" not in sb.list_files() and _sh(sb, "ls /tmp") == ""
        assert "http.server" in _sh(sb, "sleep 0.5; ps -eo args")


def test_a_cached_rebuild_is_fast_and_identical(conformance):
    from posttrain.images.build import build

    image, path, cold = conformance
    t0 = time.monotonic()
    again = build(path)
    assert time.monotonic() - t0 <= 1.0 and again.digest == image.digest and again.layers == image.layers
    (path.parent / "notes.txt").write_text("changed")  # a changed file invalidates its step onwards
    changed = build(path)
    assert changed.layers[:2] == image.layers[:2] and changed.layers[3:] != image.layers[3:]
    (path.parent / "notes.txt").write_text("n")


def test_build_errors_name_the_line(cache, tmp_path):
    from posttrain.images.build import BuildError, build

    path = _context(tmp_path / "a", "FROM debian:12\nRUN true\nRUN echo out; exit 3\n")
    with pytest.raises(BuildError, match=r"Dockerfile:3: RUN failed \(exit 3\).*without network(?s:.*)out"):
        build(path)
    net = ("FROM python:3.11\nRUN python3 -c \"import socket; "
           "socket.create_connection(('pypi.org', 443), timeout=3)\"\n")
    with pytest.raises(BuildError, match=r"Dockerfile:2: RUN failed.*without network(?s:.*)(resolution|unreachable)"):
        build(_context(tmp_path / "b", net))
    with pytest.raises(BuildError, match="Dockerfile:2: USER nobody2: no user"):
        build(_context(tmp_path / "c", "FROM debian:12\nUSER nobody2\n"))
    archive = _context(tmp_path / "d", "FROM debian:12\nADD a.tar.gz /x/\n", {"a.tar.gz": b"\x1f\x8b\x08rest"})
    with pytest.raises(BuildError, match="Dockerfile:2: ADD of an archive"):
        build(archive)


ABUSE_IMAGE = "FROM debian:12\nWORKDIR /app\n"


@pytest.fixture(scope="module")
def root_image(cache, tmp_path_factory):
    from posttrain.images.build import build

    return build(_context(tmp_path_factory.mktemp("abuse"), ABUSE_IMAGE))


def _abuse_cases():
    from posttrain.sandbox.abuse import CASES

    return CASES


@pytest.mark.parametrize("case", _abuse_cases(), ids=[c.name for c in _abuse_cases()])
def test_abuse_is_contained_as_root_in_an_image(case, root_image):
    from posttrain.sandbox import open_sandbox
    from posttrain.sandbox.abuse import run_case

    cfg = root_image.sandbox_config()
    assert cfg["uid"] == 0
    outcome = run_case(case, lambda limits: open_sandbox(limits, image=cfg))
    assert outcome.contained, outcome.detail


SERVICE_TASK = {
    "instruction.md": "A daemon runs in this environment. Write its process id to /app/pid.txt.\n",
    "task.toml": "[metadata]\nsplit = 'train'\n[verifier]\ntimeout_sec = 30.0\n",
    "environment/Dockerfile": "FROM debian:12\nRUN mkdir -p /var/run/app\nWORKDIR /app\n"
                              "COPY daemon.sh /usr/local/bin/daemon.sh\n"
                              'CMD ["/usr/local/bin/daemon.sh"]\n',
    "environment/daemon.sh": "#!/bin/sh\necho $$ > /var/run/app/daemon.pid\n"
                             "while true; do sleep 0.2; done\n",
    "solution/solve.sh": "#!/bin/bash\ncat /var/run/app/daemon.pid > /app/pid.txt\n",
    "solution/wrong.sh": "#!/bin/bash\n(sleep 300 &); echo $$ > /app/pid.txt\n",
    "tests/test.sh": "#!/bin/bash\npid=$(cat /app/pid.txt 2>/dev/null)\n"
                     "if [ -n \"$pid\" ] && grep -q daemon.sh /proc/$pid/cmdline 2>/dev/null; then\n"
                     "  echo 1 > /logs/verifier/reward.txt\nelse\n  echo 0 > /logs/verifier/reward.txt\nfi\n",
}


@pytest.mark.slow
@pytest.mark.timeout(120)  # ~5 s alone; a hang fails with the stacks of every thread
def test_a_harbor_task_with_a_service_runs_as_written(cache, tmp_path):
    """The CMD daemon runs before the first turn, is still running when the tests run (what
    the episode started is killed before grading, the service is not), and a task folder with
    an image loads, builds on first use and grades through the normal episode path."""
    from posttrain.envs import play_actions
    from posttrain.tasks.families.terminal.harbor import load_harbor_task

    folder = tmp_path / "daemon-pid"
    for rel, text in SERVICE_TASK.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(text)
    os.chmod(folder / "environment" / "daemon.sh", 0o755)
    domain = load_harbor_task(folder)
    task = domain.task(0, "train")
    assert task.verifier["image"]["dockerfile"] == "daemon-pid/environment/Dockerfile"
    assert play_actions(domain, task, domain.oracle(task)).passed
    for name, actions in domain.negatives(task).items():
        assert not play_actions(domain, task, actions).passed, name
