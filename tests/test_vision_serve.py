"""Images through posttrain's own server: the OpenAI chat policy sends `image_url` parts over
loopback to a served `VisionPolicy` (the tiny random LLaVA of `tests/tiny_vlm.py`) and gets what
the policy answers locally; a text model's server refuses an image part with a 400 naming it."""

from __future__ import annotations

from pathlib import Path

import pytest

from posttrain.policies.local import TorchPolicy
from posttrain.policies.openai_compat import OpenAIConfig, OpenAIPolicy
from posttrain.policies.serve import PolicyServer
from posttrain.tasks.registry import get_domain
from posttrain.values.generation import GenerationRequest, Message, SamplingParams
from posttrain.values.image import parts, to_openai
from tests.test_serve import post
from tests.tiny_vlm import tiny_vlm

MODEL = Path(__file__).resolve().parents[1] / "models" / "tiny-base"


def _requests():
    chart = get_domain("docs.chart.peak.bar")
    a, b = (chart.images(chart.task(s))[0] for s in range(2))
    greedy = SamplingParams(temperature=0, max_tokens=6)
    return [GenerationRequest((Message("user", parts("which quarter?", [a])),), greedy),
            GenerationRequest((Message("system", "answer briefly"), Message("user", parts("and here?", [b]))),
                              greedy),
            GenerationRequest((Message("user", "no picture"),), greedy)]


def test_a_served_vision_policy_answers_image_chat_requests_as_it_does_locally():
    vlm = tiny_vlm()
    server = PolicyServer(vlm, model_name="tiny-vlm").start()
    try:
        remote = OpenAIPolicy(OpenAIConfig(base_url=server.url, model="tiny-vlm", api="chat", max_retries=0))
        assert remote.accepts_images
        requests = _requests()
        got, want = remote.generate(requests), vlm.generate(requests)
        for g, w in zip(got, want):
            assert g.text == w.text and g.token_ids == w.token_ids and g.finish_reason == w.finish_reason
            assert g.prompt_token_ids == w.prompt_token_ids  # the images were expanded server-side
            assert g.logprobs == pytest.approx(w.logprobs, abs=1e-4)
        # a broken data URI is a 400 that names the message and the part
        bad = {"model": "tiny-vlm", "messages": [{"role": "user", "content": [
            {"type": "text", "text": "x"}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,@@"}}]}]}
        status, body = post(f"{server.url}/chat/completions", bad)
        assert status == 400 and "messages[0].content: content part 1 (image_url)" in body["error"]["message"]
        # no raw prompts on a vision server (its prompts need their images): a 400 that says so
        status, body = post(f"{server.url}/completions", {"model": "tiny-vlm", "prompt": "x"})
        assert status == 400 and "/v1/chat/completions only" in body["error"]["message"]
    finally:
        server.close()


def test_a_text_models_server_refuses_an_image_part_by_name():
    server = PolicyServer(TorchPolicy(MODEL, device="cpu"), model_name="tiny-base").start()
    try:
        request = _requests()[1]
        body = {"model": "tiny-base", "max_tokens": 4,
                "messages": [{"role": m.role, "content": to_openai(m.content)} for m in request.messages]}
        status, out = post(f"{server.url}/chat/completions", body)
        assert status == 400
        assert "messages[1].content part 1 is an image_url part" in out["error"]["message"]
        assert "'tiny-base' reads text only" in out["error"]["message"]
        # text given as parts is still text
        body["messages"] = [{"role": "user", "content": [{"type": "text", "text": "37+48="}]}]
        status, out = post(f"{server.url}/chat/completions", body)
        assert status == 200 and out["choices"][0]["finish_reason"] in ("stop", "length")
    finally:
        server.close()


def test_the_batcher_decodes_every_waiting_connection_together():
    from posttrain.policies.server.vision_batch import VisionBatcher

    vlm = tiny_vlm()
    requests = _requests()
    batcher = VisionBatcher(vlm, max_batch=8)
    futures = [batcher.submit([r]) for r in requests] + [batcher.submit(requests[:2] * 2)]  # queued before start
    batcher.start()
    try:
        got = [f.result(timeout=600) for f in futures]
        assert batcher.stats.batches == 1 and batcher.stats.largest == 7  # all seven rows in one generate
        want = vlm.generate(requests)
        assert [c.token_ids for c in got[3]] == [w.token_ids for w in want[:2] * 2]
        for (g,), w in zip(got[:3], want):
            assert g.token_ids == w.token_ids and g.text == w.text
        small = VisionBatcher(vlm, max_batch=2)  # a submission never splits; others wait their turn
        fs = [small.submit(requests) for _ in range(2)]
        small.start()
        assert [len(f.result(timeout=600)) for f in fs] == [3, 3] and small.stats.batches == 2
        small.close()
        with pytest.raises(RuntimeError, match="closed"):
            small.submit(requests)
    finally:
        batcher.close()


@pytest.mark.slow  # a live server process, like the text model's (its answers: the first test here)
def test_the_serve_command_serves_a_saved_vision_model_as_it_answers_in_process(tmp_path):
    import os
    import subprocess
    import sys

    from posttrain.policies.vision import VisionPolicy

    vlm = tiny_vlm()
    vlm.model.save_pretrained(tmp_path / "vlm")
    vlm.processor.save_pretrained(tmp_path / "vlm")
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1] / "src"))
    proc = subprocess.Popen([sys.executable, "-m", "posttrain.policies.serve", "--model", str(tmp_path / "vlm"),
                             "--port", "0", "--name", "tiny-vlm", "--prefix-cache-mb", "16"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        assert proc.stdout is not None
        line = ""
        while "listening on" not in line:
            line = proc.stdout.readline()
            assert line or proc.poll() is None, "the server exited before listening"
        url = line.split("listening on", 1)[1].strip()
        remote = OpenAIPolicy(OpenAIConfig(base_url=url, model="tiny-vlm", api="chat", max_retries=0))
        local = VisionPolicy.load(tmp_path / "vlm")
        requests = _requests()
        got, want = remote.generate(requests), local.generate(requests)
        for g, w in zip(got, want):
            assert g.text == w.text and g.token_ids == w.token_ids and g.prompt_token_ids == w.prompt_token_ids
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def test_a_vision_server_reloads_the_weights_a_trainer_writes(tmp_path):
    from posttrain.policies.server.weights import untied_state_dict, write_weights

    served, other = tiny_vlm(), tiny_vlm(seed=1)
    server = PolicyServer(served, model_name="tiny-vlm").start()
    base = server.url.removesuffix("/v1")
    try:
        remote = OpenAIPolicy(OpenAIConfig(base_url=server.url, model="tiny-vlm", api="chat", max_retries=0))
        requests = _requests()[:2]
        before = remote.generate(requests)
        write_weights(untied_state_dict(other.model), tmp_path / "w1")
        assert post(f"{base}/pause?mode=keep")[0] == 200
        status, body = post(f"{base}/collective_rpc", {"method": "reload_weights",
                                                       "kwargs": {"weights_path": str(tmp_path / "w1")}})
        assert status == 200 and body["results"][0]["tensors"] == len(untied_state_dict(other.model))
        assert post(f"{base}/resume")[0] == 200
        after, want = remote.generate(requests), other.generate(requests)
        assert [c.token_ids for c in after] == [c.token_ids for c in want]
        assert [c.token_ids for c in after] != [c.token_ids for c in before]
        # a directory that does not fit the model: a 400 naming what is missing, weights unchanged
        write_weights({"lm_head.weight": untied_state_dict(other.model)["lm_head.weight"]}, tmp_path / "w2")
        status, body = post(f"{base}/collective_rpc", {"method": "reload_weights",
                                                       "kwargs": {"weights_path": str(tmp_path / "w2")}})
        assert status == 400 and "weights missing for" in body["error"]["message"]
    finally:
        server.close()
