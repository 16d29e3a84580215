"""OpenAIPolicy against a live local server (`posttrain.policies.serve`, a real process on
127.0.0.1 serving the shipped tiny model), and what happens when that server goes away."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from posttrain.policies.base import PolicyError
from posttrain.policies.local import TorchPolicy
from posttrain.policies.openai_compat import OpenAIConfig, OpenAIPolicy
from posttrain.values.generation import GenerationRequest, Message, SamplingParams

MODEL = Path(__file__).resolve().parents[1] / "models" / "tiny-base"
PROMPTS = ["37+48=", "reverse abc=", "max(3,9,4)=", "upper xyz="]


def req(prompt: str, **sampling) -> GenerationRequest:
    return GenerationRequest((Message("user", prompt),), SamplingParams(**sampling))


def start_server() -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "posttrain.policies.serve", "--model", str(MODEL), "--port", "0",
         "--device", "cpu", "--threads", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    deadline = time.monotonic() + 120
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("listening on "):
            return proc, line.split()[-1]
        if time.monotonic() > deadline:
            break
    proc.kill()
    raise RuntimeError(f"server did not start: {proc.stdout.read() if proc.stdout else ''}")


@pytest.fixture(scope="module")
def server():
    proc, url = start_server()
    yield proc, url
    proc.kill()
    proc.wait()


@pytest.fixture(scope="module")
def local(tiny_policy) -> TorchPolicy:
    return tiny_policy


@pytest.mark.slow
@pytest.mark.parametrize("api", ["completions", "chat"])
def test_greedy_matches_the_local_policy_with_ids_and_logprobs(server, local, api):
    _, url = server
    remote = OpenAIPolicy(OpenAIConfig(base_url=url, model="tiny-base", api=api, max_retries=0))
    requests = [req(p, temperature=0.0, max_tokens=8, stop=("\n",)) for p in PROMPTS]
    got, want = remote.generate(requests), local.generate(requests)
    for g, w in zip(got, want):
        assert g.text == w.text and g.finish_reason == w.finish_reason
        assert g.token_ids == w.token_ids and g.prompt_token_ids == w.prompt_token_ids
        assert g.logprobs == pytest.approx(w.logprobs, abs=1e-5)


@pytest.mark.slow
def test_sampling_with_seed_is_reproducible_through_the_server(server):
    _, url = server
    remote = OpenAIPolicy(OpenAIConfig(base_url=url, model="tiny-base", max_retries=0))
    requests = [req("caesar+3 abc=", temperature=1.0, max_tokens=6, seed=s) for s in range(4)]
    first, second = remote.generate(requests), remote.generate(requests)
    assert [c.token_ids for c in first] == [c.token_ids for c in second]


@pytest.mark.slow
def test_a_rejected_request_is_that_request_s_error(server):
    _, url = server
    remote = OpenAIPolicy(OpenAIConfig(base_url=url, model="tiny-base", max_retries=0))
    out = remote.generate([req("1" * 500, max_tokens=4), req("1+1=", temperature=0.0, max_tokens=4)])
    assert out[0].finish_reason == "error" and "context" in out[0].error and out[0].context_exceeded
    assert not out[1].context_exceeded
    assert out[1].finish_reason in ("stop", "length")


def post(url: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.mark.slow
def test_server_speaks_the_openai_schema_and_refuses_what_it_cannot_do(server):
    _, url = server
    status, body = post(f"{url}/completions", {"model": "m", "prompt": ["1+1=", "2+2="], "n": 2,
                                               "max_tokens": 3, "temperature": 0, "logprobs": 1})
    assert status == 200 and len(body["choices"]) == 4
    assert body["choices"][0]["logprobs"]["token_logprobs"] and "token_ids" not in body["choices"][0]
    status, body = post(f"{url}/completions", {"model": "m", "prompt": "1+1=", "best_of": 3})
    assert status == 400 and "best_of" in body["error"]["message"]
    status, body = post(f"{url}/chat/completions", {"model": "m", "messages": [{"role": "x"}]})
    assert status == 400 and "messages" in body["error"]["message"]
    with urllib.request.urlopen(f"{url}/models", timeout=30) as r:
        assert json.loads(r.read())["data"][0]["id"] == "tiny-base"


def test_server_down_is_a_policy_error_after_bounded_retries(local):
    from posttrain.policies.serve import PolicyServer

    server = PolicyServer(local).start()  # a second live server, in this process, then stopped
    remote = OpenAIPolicy(OpenAIConfig(base_url=server.url, model="tiny-base", max_retries=2, timeout_s=5))
    assert remote.generate([req("1+1=", temperature=0.0, max_tokens=3)])[0].token_ids
    server.close()
    t0 = time.monotonic()
    with pytest.raises(PolicyError, match="failed after 2 retries"):
        remote.generate([req("1+1=", max_tokens=3)])
    assert time.monotonic() - t0 < 30  # bounded: the backoff of two retries, not a hang


def test_bad_config_names_the_field():
    with pytest.raises(ValueError, match="OpenAIConfig.api"):
        OpenAIConfig(base_url="http://127.0.0.1:1/v1", model="m", api="responses")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="OpenAIConfig.base_url"):
        OpenAIConfig(base_url="127.0.0.1:1", model="m")


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_a_missing_or_non_finite_logprob_drops_the_completions_logprobs(api):
    """A server that gives a token no log-prob (null), or -inf / nan, would make the trainer's
    ratio inf or nan: the completion keeps its tokens and text but no log-probs (the trainer then
    recomputes the old ones), and finite ones are kept as sent."""
    from types import SimpleNamespace

    policy = OpenAIPolicy(OpenAIConfig(base_url="http://127.0.0.1:1/v1", model="m", api=api))

    def choice(lps):
        if api == "completions":
            logprobs = SimpleNamespace(token_logprobs=lps)
            return SimpleNamespace(text="ab", logprobs=logprobs, finish_reason="stop", token_ids=[5, 6],
                                   prompt_token_ids=[1])
        content = [SimpleNamespace(logprob=x) for x in lps]
        return SimpleNamespace(message=SimpleNamespace(content="ab"), logprobs=SimpleNamespace(content=content),
                               finish_reason="stop", token_ids=[5, 6], prompt_token_ids=[1])

    assert policy._completion(choice([-0.5, -1.0]), 0.1).logprobs == [-0.5, -1.0]
    for bad in ([-0.5, None], [-0.5, float("-inf")], [float("nan"), -1.0]):
        c = policy._completion(choice(bad), 0.1)
        assert c.logprobs is None and c.token_ids == [5, 6] and c.text == "ab" and c.finish_reason == "stop"
