"""A real vLLM (CPU build, from `.venv-vllm`) in the loop: tiny-base trained for a few steps with
generation on vLLM and weight sync after every step; after each sync vLLM's greedy output is
token for token `TorchPolicy`'s on the trainer's weights, and its log-probs are the trainer's.

Built by `scripts/bootstrap.sh --vllm` (and `--test`); without it the test is skipped and says so.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
import torch

from posttrain.policies.local import TorchPolicy
from posttrain.policies.server.routed import ServedPolicy
from posttrain.policies.server.weights import export_untied_model
from posttrain.training.config import TrainerConfig
from posttrain.training.engines.parity import TASKS
from posttrain.training.sync import WeightSync
from posttrain.training.trainer import Trainer
from posttrain.values.generation import GenerationRequest, Message, SamplingParams
from posttrain.values.trajectory import Trajectory, Turn
from posttrain.values.verdict import Verdict

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "models" / "tiny-base"
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def vllm_url(tmp_path_factory):
    if not VLLM_PYTHON.exists():
        pytest.skip(f"vLLM is not installed ({VLLM_PYTHON} missing): run scripts/bootstrap.sh --vllm")
    work = tmp_path_factory.mktemp("vllm")
    # vLLM keeps a tied model's old output head after a reload: serve an untied copy
    served = export_untied_model(MODEL, work / "tiny-base-untied")
    port = _free_port()
    log = (work / "vllm.log").open("w")
    proc = subprocess.Popen(
        [str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", str(served),
         "--served-model-name", "tiny-base", "--dtype", "float32", "--max-model-len", "128",
         "--enforce-eager", "--host", "127.0.0.1", "--port", str(port)],
        stdout=log, stderr=subprocess.STDOUT, cwd=work,
        env={**os.environ, "VLLM_SERVER_DEV_MODE": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
             "PYTHONPATH": ""})
    url = f"http://127.0.0.1:{port}/v1"
    deadline = time.monotonic() + 600
    while True:
        try:
            with urllib.request.urlopen(f"{url}/models", timeout=5):
                break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail("vLLM did not start:\n" + (work / "vllm.log").read_text()[-3000:])
            time.sleep(1)
    yield url
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _group(policy, prompt: str, good: str, step: int) -> list[Trajectory]:
    reqs = [GenerationRequest((Message("user", prompt),), SamplingParams(temperature=1.0, max_tokens=6,
                                                                         seed=100 * step + i),
                              meta={"episode": f"{prompt}-{step}-{i}"}) for i in range(4)]
    group = []
    for c in policy.generate(reqs):
        assert c.token_ids and c.logprobs and len(c.logprobs) == len(c.token_ids)
        turn = Turn(index=0, observation="", action=c.text, prompt_token_ids=c.prompt_token_ids,
                    token_ids=c.token_ids, logprobs=c.logprobs, finish_reason=c.finish_reason)
        reward = float(c.text.split("\n")[0] == good)
        group.append(Trajectory(task_key=prompt, task_hash=prompt, domain="vllm", split="train",
                                policy_version=policy.version.name, status="completed", turns=[turn],
                                reward=reward, sampling={"temperature": 1.0},
                                verdict=Verdict(passed=bool(reward), score=reward)))
    if len({t.reward for t in group}) == 1:  # a signal in every group
        group[0].reward = 1.0 - group[0].reward
    return group


def _greedy(policy, prompts: list[str]):
    return policy.generate([GenerationRequest((Message("user", p),), SamplingParams(temperature=0.0, max_tokens=8))
                            for p in prompts])


def test_training_with_generation_on_vllm_and_a_sync_every_step(vllm_url, tmp_path):
    torch.set_num_threads(1)
    trainer = Trainer(MODEL, TrainerConfig(lr=3e-3, tis_cap=2.0))
    served = ServedPolicy([vllm_url], "tiny-base", tokenizer=trainer.tokenizer, version=trainer.version)
    sync = WeightSync(served.roots, tmp_path / "weights")
    prompts = [p for p, _ in TASKS]
    sync.publish(trainer.model, trainer.version)  # vLLM serves the trainer's starting weights
    for step in range(3):
        groups = [_group(served, prompt, good, step) for prompt, good in TASKS[:4]]
        metrics = trainer.step(groups)
        # vLLM's log-probs are the trainer's (same weights, T = 1): the behaviour policy agrees
        assert metrics["tis_applied"] == 1 and metrics["mismatch_abs_logp"] < 1e-3
        sync.publish(trainer.model, trainer.version)
        served.set_version(trainer.version)
        local = TorchPolicy(trainer.model, trainer.tokenizer, version=trainer.version)
        got, want = _greedy(served, prompts), _greedy(local, prompts)
        for g, w in zip(got, want):
            assert g.prompt_token_ids == w.prompt_token_ids
            assert g.text == w.text and g.token_ids == w.token_ids, (step, g.text, w.text)
            assert g.logprobs == pytest.approx(w.logprobs, abs=1e-4)
    assert len(sync.times) == 4 and max(sync.times) < 30
    # the weights really moved: the served model is no longer the base model
    base = _greedy(TorchPolicy(MODEL, device="cpu"), prompts)
    assert any(abs(a - b) > 1e-3 for x, y in zip(base, got) for a, b in zip(x.logprobs, y.logprobs))
