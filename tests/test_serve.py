"""posttrain's own server (`posttrain.policies.serve`): many concurrent connections batched
together, and vLLM's weight-update routes (pause / reload_weights / reset_prefix_cache / resume)
with nothing in flight lost."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from posttrain.policies.local import TorchPolicy
from posttrain.policies.openai_compat import OpenAIConfig, OpenAIPolicy
from posttrain.policies.serve import PolicyServer
from posttrain.policies.server.weights import untied_state_dict, write_weights
from posttrain.values.generation import GenerationRequest, Message, SamplingParams

MODEL = Path(__file__).resolve().parents[1] / "models" / "tiny-base"
PROMPTS = ["37+48=", "reverse abc=", "max(3,9,4)=", "upper xyz=", "12*3=", "sort 3,1,2="]


def req(prompt: str, **sampling) -> GenerationRequest:
    return GenerationRequest((Message("user", prompt),), SamplingParams(**sampling))


def post(url: str, body: dict | None = None, timeout: float = 60) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=json.dumps(body or {}).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def root(server: PolicyServer) -> str:
    return server.url.removesuffix("/v1")


def perturbed(seed: int, head_only: bool = False) -> TorchPolicy:
    """The tiny model with every weight (or only an untied output head) moved a little."""
    policy = TorchPolicy(MODEL, device="cpu")
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        if head_only:
            head = policy.model.get_output_embeddings()
            head.weight = torch.nn.Parameter(head.weight + 0.5 * torch.randn(head.weight.shape, generator=gen))
            policy.model.config.tie_word_embeddings = False
        else:
            for p in policy.model.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=gen))
    return policy


@pytest.fixture
def server(tiny_policy):
    srv = PolicyServer(TorchPolicy(MODEL, device="cpu"), model_name="tiny-base").start()
    yield srv
    srv.close()


def test_concurrent_connections_are_batched_and_each_gets_its_own_answer(server, tiny_policy):
    remote = OpenAIPolicy(OpenAIConfig(base_url=server.url, model="tiny-base", max_retries=0,
                                       max_concurrency=64))
    # 64 greedy requests at once, of different lengths: rows join and leave the running batch
    requests = [req(PROMPTS[i % len(PROMPTS)], temperature=0.0, max_tokens=4 + i % 13, stop=("\n",))
                for i in range(64)]
    got = remote.generate(requests)
    want = tiny_policy.generate(requests)
    assert server.engine.stats.max_rows > 8  # they really were decoded together
    for g, w in zip(got, want):
        assert g.text == w.text and g.token_ids == w.token_ids and g.finish_reason == w.finish_reason
        assert g.logprobs == pytest.approx(w.logprobs, abs=1e-4)


def test_a_prompt_given_as_token_ids_and_n_rows(server, tiny_policy):
    ids = tiny_policy.tokenizer("37+48=")["input_ids"]
    status, body = post(f"{server.url}/completions", {"model": "tiny-base", "prompt": ids, "n": 3,
                                                      "max_tokens": 5, "temperature": 0,
                                                      "return_token_ids": True})
    assert status == 200 and len(body["choices"]) == 3
    assert all(c["prompt_token_ids"] == ids for c in body["choices"])
    assert len({tuple(c["token_ids"]) for c in body["choices"]}) == 1  # greedy: one answer
    status, body = post(f"{server.url}/completions", {"model": "tiny-base", "prompt": [10**6]})
    assert status == 400 and "vocabulary" in body["error"]["message"]


def test_reload_under_load_keeps_every_request_and_serves_the_new_weights(server, tmp_path):
    new = perturbed(seed=1)
    write_weights(untied_state_dict(new.model), tmp_path / "w")
    remote = OpenAIPolicy(OpenAIConfig(base_url=server.url, model="tiny-base", max_retries=0,
                                       max_concurrency=32))
    # 32 requests that run to 40 tokens whatever they sample (vLLM's ignore_eos)
    bodies = [{"model": "tiny-base", "prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": 40, "seed": i,
               "temperature": 1.0, "ignore_eos": True, "return_token_ids": True} for i in range(32)]
    with ThreadPoolExecutor(32) as pool:
        in_flight = [pool.submit(post, f"{server.url}/completions", b, 300) for b in bodies]
        deadline = time.monotonic() + 60
        # every request admitted (prefilled under the old weights) before the pause: one still
        # waiting would be prefilled after the reload, and its keys/values may rightly be cached
        while (server.engine.stats.steps < 3 or server.engine.rows_in_flight < 32) \
                and time.monotonic() < deadline:
            time.sleep(0.01)
        assert post(f"{root(server)}/pause?mode=keep")[0] == 200
        steps = server.engine.stats.steps
        with urllib.request.urlopen(f"{root(server)}/is_paused", timeout=10) as r:
            assert json.loads(r.read())["is_paused"] is True
        assert not any(f.done() for f in in_flight)
        status, body = post(f"{root(server)}/collective_rpc",
                            {"method": "reload_weights", "kwargs": {"weights_path": str(tmp_path / "w")}})
        assert status == 200, body
        assert post(f"{root(server)}/reset_prefix_cache")[0] == 200
        time.sleep(0.2)
        assert server.engine.stats.steps == steps  # paused means no decoding
        assert post(f"{root(server)}/resume")[0] == 200
        done = [f.result(timeout=300) for f in in_flight]
    # none lost, none cut short: every request decoded its 40 tokens across the reload
    assert [status for status, _ in done] == [200] * 32
    assert all(len(body["choices"][0]["token_ids"]) == 40 for _, body in done)
    # rows prefilled under the old weights finished after the reload: none of their keys/values
    # may enter the prefix cache (the probe below would reuse them)
    assert server.engine.prefix_cache is None or len(server.engine.prefix_cache) == 0
    # after the reload the server serves exactly the new weights
    probe = [req(p, temperature=0.0, max_tokens=8) for p in PROMPTS]
    got, want = remote.generate(probe), new.generate(probe)
    assert [c.token_ids for c in got] == [c.token_ids for c in want]
    for g, w in zip(got, want):
        assert g.logprobs == pytest.approx(w.logprobs, abs=1e-4)
    assert server.engine.weights_path == str(tmp_path / "w")


def test_a_tied_model_serves_a_reloaded_untied_head(server, tmp_path):
    """vLLM's trap: a tied model kept its old output head after a reload. Here the head is
    untied on reload, so the served model is the directory's, head included."""
    new = perturbed(seed=2, head_only=True)
    state = untied_state_dict(new.model)
    assert not torch.equal(state["lm_head.weight"], state["transformer.wte.weight"])
    write_weights(state, tmp_path / "w")
    assert post(f"{root(server)}/collective_rpc",
                {"method": "reload_weights", "kwargs": {"weights_path": str(tmp_path / "w")}})[0] == 200
    remote = OpenAIPolicy(OpenAIConfig(base_url=server.url, model="tiny-base", max_retries=0))
    probe = [req(p, temperature=0.0, max_tokens=6) for p in PROMPTS]
    assert [c.token_ids for c in remote.generate(probe)] == [c.token_ids for c in new.generate(probe)]


def test_prefix_cache_serves_a_next_turn_and_is_emptied_by_a_reload(server, tmp_path):
    engine = server.engine
    remote = OpenAIPolicy(OpenAIConfig(base_url=server.url, model="tiny-base", max_retries=0))
    [first] = remote.generate([req("37+48=", temperature=0.0, max_tokens=6)])
    status, body = post(f"{server.url}/completions", {
        "model": "tiny-base", "prompt": first.prompt_token_ids + first.token_ids[:-1] + [5, 6],
        "max_tokens": 3, "temperature": 0})
    assert status == 200
    assert engine.prefix_cache is not None and engine.prefix_cache.hits >= 1
    write_weights(untied_state_dict(perturbed(seed=3).model), tmp_path / "w")
    engine.reload_weights(str(tmp_path / "w"))
    assert len(engine.prefix_cache) == 0  # keys/values of the old weights are never reused


def test_weight_routes_refuse_what_they_cannot_do(server, tmp_path):
    status, body = post(f"{root(server)}/collective_rpc", {"method": "update_weights", "kwargs": {}})
    assert status == 400 and "reload_weights" in body["error"]["message"]
    status, body = post(f"{root(server)}/collective_rpc",
                        {"method": "reload_weights", "kwargs": {"weights_path": str(tmp_path / "nope")}})
    assert status == 400 and "nope" in body["error"]["message"]
    partial = {k: v for k, v in untied_state_dict(perturbed(seed=4).model).items() if "h.0." not in k}
    write_weights(partial, tmp_path / "partial")
    status, body = post(f"{root(server)}/collective_rpc",
                        {"method": "reload_weights", "kwargs": {"weights_path": str(tmp_path / "partial")}})
    assert status == 400 and "missing" in body["error"]["message"]
    assert post(f"{root(server)}/pause?mode=abort")[0] == 400
    # the server still serves the weights it had
    remote = OpenAIPolicy(OpenAIConfig(base_url=server.url, model="tiny-base", max_retries=0))
    assert remote.generate([req("1+1=", temperature=0.0, max_tokens=3)])[0].token_ids


def test_pause_wait_lets_in_flight_requests_finish_first(server):
    remote = OpenAIPolicy(OpenAIConfig(base_url=server.url, model="tiny-base", max_retries=0))
    with ThreadPoolExecutor(1) as pool:
        in_flight = pool.submit(remote.generate, [req(p, temperature=1.0, max_tokens=30, seed=1) for p in PROMPTS])
        deadline = time.monotonic() + 60
        while server.engine.stats.requests < len(PROMPTS) and time.monotonic() < deadline:
            time.sleep(0.005)  # every request is in the engine
        assert post(f"{root(server)}/pause?mode=wait")[0] == 200
        assert server.engine.load() == 0 and server.engine.paused
        done = in_flight.result(timeout=60)  # answered while the server stays paused
        assert all(c.token_ids for c in done)
        post(f"{root(server)}/resume")
