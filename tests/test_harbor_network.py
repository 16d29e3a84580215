"""Harbor conformance, network while building: RUN steps reach the network only when the build
asks for it (`build(network=True)`, `posttrain image build --network`, `harbor:DIR?network=1`),
never in an episode over the image, and the layer cache does not depend on it.

No packet leaves this machine: the only peer is a listener on 127.0.0.1 in this process (the
host's loopback, which a sandbox without the host's network cannot see)."""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from posttrain.sandbox.bwrap import bwrap_problem

PROBLEM = bwrap_problem()
pytestmark = pytest.mark.skipif(PROBLEM is not None, reason=f"bubblewrap unavailable: {PROBLEM}")

CONNECT = ("python3 -c \"import socket; s = socket.create_connection(('127.0.0.1', {port}), "
           "timeout=5); s.sendall(b'{tag}'); s.close()\"")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    from posttrain.images.store import CACHE_ENV

    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "image-cache"))
    return tmp_path / "image-cache"


@pytest.fixture
def listener():
    """A TCP listener on the host's 127.0.0.1; `.heard` collects what each connection sent, and
    `.wait(n)` waits for the n-th: a client's connection completes in the kernel's backlog, so the
    step that made it can return before this thread has accepted it (a race under load)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(0.2)
    heard: list[bytes] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except (TimeoutError, OSError):
                continue
            with conn:
                conn.settimeout(5)
                heard.append(conn.recv(100))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()

    def wait(n: int, timeout_s: float = 15.0) -> list[bytes]:
        deadline = time.monotonic() + timeout_s
        while len(heard) < n and time.monotonic() < deadline:
            time.sleep(0.02)
        return heard

    yield SimpleNamespace(port=server.getsockname()[1], heard=heard, wait=wait)
    stop.set()
    thread.join(5)
    server.close()


def _dockerfile(root: Path, port: int, tag: str) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "Dockerfile").write_text(f"FROM python:3.11-slim\nWORKDIR /app\n"
                                     f"RUN {CONNECT.format(port=port, tag=tag)} && echo {tag} > /reached"
                                     " && (cat /etc/resolv.conf > /resolv.seen || true)\n")
    return root / "Dockerfile"


def test_run_steps_reach_the_host_network_only_when_asked(cache, listener, tmp_path):
    from posttrain.images.build import BuildError, build
    from posttrain.sandbox import Limits, open_sandbox

    port = listener.port
    dockerfile = _dockerfile(tmp_path / "ctx", port, "built")
    with pytest.raises(BuildError, match=r"Dockerfile:3: RUN failed.*--network"):
        build(dockerfile)
    assert listener.heard == []

    image = build(dockerfile, network=True)
    assert listener.wait(1) == [b"built"]
    # the resolver files were bound for the step (the host's), and are not part of its layer
    if os.path.isfile("/etc/resolv.conf"):
        seen = [f"{layer}/resolv.seen" for layer in image.layers if os.path.isfile(f"{layer}/resolv.seen")]
        assert seen and Path(seen[0]).read_text() == Path("/etc/resolv.conf").read_text()
    assert not any(os.path.lexists(f"{layer}/etc/{name}") for layer in image.layers
                   for name in ("resolv.conf", "hosts"))
    again = build(dockerfile)  # cached: the key does not depend on the network
    assert again.digest == image.digest and listener.heard == [b"built"]

    # an episode over the image never has the host's network
    with open_sandbox(Limits(wall_s=30), image=image.sandbox_config()) as sb:
        assert sb.run("cat /reached").stdout == "built\n"
        r = sb.run(CONNECT.format(port=port, tag="episode"))
        assert r.exit_code != 0 and "Error" in r.stderr
    assert listener.heard == [b"built"]


def test_the_network_is_refused_to_a_sandbox_with_a_workspace(cache, listener, tmp_path):
    from posttrain.images.build import build
    from posttrain.sandbox import Limits, open_sandbox
    from posttrain.sandbox.base import SandboxError

    image = build(_dockerfile(tmp_path / "ctx", listener.port, "x"), network=True)
    with pytest.raises((SandboxError, ValueError), match="image build steps only"):
        with open_sandbox(Limits(wall_s=30), image={**image.sandbox_config(), "network": True}):
            pass


def test_the_cli_flag_and_the_source_setting(cache, listener, tmp_path):
    from typer.testing import CliRunner

    from posttrain.images.cli import app
    from posttrain.images.episode import image_for
    from posttrain.tasks.sources import SourceError, load_source

    port = listener.port
    _dockerfile(tmp_path / "cli", port, "cli")
    runner = CliRunner()
    r = runner.invoke(app, ["build", str(tmp_path / "cli")])
    assert r.exit_code == 1 and "--network" in r.output and listener.heard == []
    r = runner.invoke(app, ["build", "--network", str(tmp_path / "cli")])
    assert r.exit_code == 0, r.output
    assert "with the host's network" in r.output and listener.wait(1) == [b"cli"]

    folder = tmp_path / "tasks" / "net-task"
    _dockerfile(folder / "environment", port, "source")
    (folder / "instruction.md").write_text("Say hi.\n")
    (folder / "task.toml").write_text("[metadata]\nsplit = 'train'\n")
    for rel in ("tests/test.sh", "solution/solve.sh"):
        (folder / rel).parent.mkdir()
        (folder / rel).write_text("echo 1 > /logs/verifier/reward.txt\n")
    with pytest.raises(SourceError, match="unknown option net='1'"):
        load_source(f"harbor:{tmp_path / 'tasks'}?net=1")
    (domain,) = load_source(f"harbor:{tmp_path / 'tasks'}?network=1")
    image = image_for(domain.task(0, "train"))
    assert image is not None and listener.wait(2) == [b"cli", b"source"]


@pytest.fixture
def http_server(tmp_path):
    """An HTTP server on the host's 127.0.0.1 serving `root`; `.hits` counts the GETs."""
    import functools
    import http.server

    root = tmp_path / "served"
    root.mkdir()
    hits: list[str] = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the stdlib's name
            hits.append(self.path)
            super().do_GET()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                             functools.partial(Handler, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield SimpleNamespace(root=root, hits=hits, url=f"http://127.0.0.1:{server.server_address[1]}")
    server.shutdown()
    server.server_close()


def test_run_network_per_step(cache, listener, tmp_path):
    from posttrain.images.build import build
    from posttrain.images.dockerfile import DockerfileError

    port = listener.port
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "Dockerfile").write_text(
        "FROM python:3.11-slim\n"
        f"RUN --network=default {CONNECT.format(port=port, tag='default')}\n"
        f"RUN --network=none {CONNECT.format(port=port, tag='none')} || echo refused > /none\n")
    with pytest.raises(DockerfileError, match=r"Dockerfile:2: RUN --network=default needs the network.*--network"):
        build(ctx / "Dockerfile")
    image = build(ctx / "Dockerfile", network=True)
    assert listener.wait(1) == [b"default"]  # the --network=none step had no network
    assert any(os.path.isfile(f"{layer}/none") for layer in image.layers)


def test_add_of_a_url(cache, http_server, tmp_path):
    import hashlib

    from posttrain.images.build import BuildError, build
    from posttrain.images.dockerfile import DockerfileError
    from posttrain.sandbox import Limits, open_sandbox

    blob = bytes(range(256)) * 8
    (http_server.root / "tool.tar.gz").write_bytes(blob)
    (http_server.root / "notes.txt").write_text("v1\n")
    good = "sha256:" + hashlib.sha256(blob).hexdigest()
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    dockerfile = ctx / "Dockerfile"
    dockerfile.write_text(f"FROM debian:12\nWORKDIR /app\n"
                          f"ADD --checksum={good} {http_server.url}/tool.tar.gz /opt/\n"
                          f"ADD --chmod=644 {http_server.url}/notes.txt notes.txt\n")
    with pytest.raises(DockerfileError, match=r"Dockerfile:3: ADD of a URL \(http://127.0.0.1:\d+/tool.tar.gz\) "
                                         "needs the network"):
        build(dockerfile)
    assert http_server.hits == []
    image = build(dockerfile, network=True)
    with open_sandbox(Limits(wall_s=30), image=image.sandbox_config()) as sb:
        out = sb.run("stat -c '%n %a' /opt/tool.tar.gz notes.txt; cat notes.txt; sha256sum /opt/tool.tar.gz").stdout
    assert out.splitlines()[:3] == ["/opt/tool.tar.gz 600", "notes.txt 644", "v1"]  # 0600: Docker's
    assert good[len("sha256:"):] in out  # byte-exact, never unpacked
    assert sorted(http_server.hits) == ["/notes.txt", "/tool.tar.gz"]

    # cached: the checksummed file is not fetched again; the other one is, every build, and
    # the image stays the same while it serves the same bytes
    again = build(dockerfile, network=True)
    assert again.digest == image.digest and sorted(http_server.hits) == ["/notes.txt"] * 2 + ["/tool.tar.gz"]
    (http_server.root / "notes.txt").write_text("v2\n")
    changed = build(dockerfile, network=True)
    assert changed.digest != image.digest and changed.layers[:-1] == image.layers[:-1]

    # a checksum that does not match what is served: an error naming the line and both digests
    dockerfile.write_text(f"FROM debian:12\nADD --checksum=sha256:{'0' * 64} {http_server.url}/tool.tar.gz /opt/\n")
    with pytest.raises(BuildError, match=f"Dockerfile:2: ADD .*checksum mismatch.*{good}"):
        build(dockerfile, network=True)
