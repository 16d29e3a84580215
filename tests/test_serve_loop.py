"""Training with generation on an inference server (posttrain's own, a real process) and weight
sync every step: the served weights are the trainer's after each sync, every trajectory records
the version it was served under, and nothing older than the staleness bound is trained on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from posttrain.policies.local import TorchPolicy
from posttrain.policies.openai_compat import OpenAIConfig, OpenAIPolicy
from posttrain.policies.server.routed import ServedPolicy, parse_engine
from posttrain.values.generation import GenerationRequest, Message, SamplingParams

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "models" / "tiny-base"

CONFIG = """
name = "served"
runs_dir = "{runs}"
steps = 3
checkpoint_every = 1
keep_checkpoints = 3
[domains]
train = ["math.add.d2", "text.reverse.l3"]
heldout = []
[rollout]
group_size = 4
groups_per_step = 4
engine = "{engine}"
[eval]
tasks_per_domain = 2
samples = 1
[scheduler]
max_staleness = {staleness}
"""


def start_server() -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "posttrain.policies.serve", "--model", str(MODEL), "--port", "0",
         "--name", "tiny-base", "--threads", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src"), "TOKENIZERS_PARALLELISM": "false"})
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("listening on "):
            return proc, line.split()[-1]
    proc.kill()
    raise RuntimeError("server did not start")


@pytest.fixture(scope="module")
def server():
    proc, url = start_server()
    yield url
    proc.kill()
    proc.wait()


def greedy(policy, prompts):
    return [c.token_ids for c in policy.generate(
        [GenerationRequest((Message("user", p),), SamplingParams(temperature=0.0, max_tokens=8)) for p in prompts])]


@pytest.mark.slow
@pytest.mark.parametrize("staleness", [0, 1])
def test_training_through_a_server_syncs_every_step(server, tmp_path, staleness):
    cfg = tmp_path / "served.toml"
    cfg.write_text(CONFIG.format(runs=tmp_path / "runs", engine=f"openai:{server}#tiny-base",
                                 staleness=staleness))
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    p = subprocess.run([sys.executable, "-m", "posttrain.cli", "run", str(cfg), "--json"],
                       capture_output=True, text=True, env=env, cwd=ROOT, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:] + p.stdout[-3000:]
    run = tmp_path / "runs" / "served"
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:
        assert r["stale_trained"] == 0 and r["version_mismatches"] == 0
        assert r["served_staleness_max"] <= staleness
        assert 0 < r["sync_s"] < 30
    # the server now serves exactly the last step's weights
    with urllib.request.urlopen(f"{server}/models", timeout=10) as resp:
        assert json.loads(resp.read())["data"][0]["weights_path"] == str((run / "weights" / "current").resolve())
    trained = TorchPolicy(run / "checkpoints" / "step-3", device="cpu")
    remote = OpenAIPolicy(OpenAIConfig(base_url=server, model="tiny-base", max_retries=0))
    prompts = ["37+48=", "reverse abc=", "12+30=", "reverse xyz="]
    assert greedy(remote, prompts) == greedy(trained, prompts)
    # every trajectory records the version it was served under, one the trainer produced
    from posttrain.storage.store import Store
    with Store.for_run_dir(run, readonly=True) as store:
        versions = {t.policy_version for t in store.trajectories(run_id="served")}
    assert versions and versions <= {"tiny-base", "served/step-1", "served/step-2", "served/step-3"}


def test_engine_spec_is_checked_and_routing_is_sticky_and_least_loaded():
    assert parse_engine("openai:http://a:1/v1,http://b:2/v1#m") == (["http://a:1/v1", "http://b:2/v1"], "m")
    for bad in ("vllm:http://a/v1#m", "openai:http://a/v1", "openai:a:1/v1#m"):
        with pytest.raises(ValueError, match="rollout.engine"):
            parse_engine(bad)
    policy = ServedPolicy(["http://127.0.0.1:9/v1", "http://127.0.0.1:10/v1"], "m")
    assert policy.roots == ["http://127.0.0.1:9", "http://127.0.0.1:10"]

    def request(episode: str) -> GenerationRequest:
        return GenerationRequest((Message("user", "x"),), meta={"episode": episode})

    first = policy._route(request("e1"))          # nothing in flight: the first server
    second = policy._route(request("e2"))         # e1 holds one: the other server
    assert {first, second} == {0, 1}
    assert policy._route(request("e1")) == first  # sticky, however loaded
    assert policy.first_version == {"e1": "m", "e2": "m"}
