"""Image domains end to end: observations carry images, episodes record their hashes, the store
keeps each image once, replay re-renders them byte-identically, text-only policies get the
declared fallback or a refusal, and the OpenAI chat wire form carries image parts."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from posttrain.envs import EnvConfig
from posttrain.envs.vision import VisionRequired, for_policy, refused, vision_mode
from posttrain.policies.base import Policy
from posttrain.policies.openai_compat import OpenAIConfig, OpenAIPolicy
from posttrain.policies.render import plain_text
from posttrain.policies.scripted import ScriptedPolicy
from posttrain.scheduling.engine import run_episodes
from posttrain.scheduling.replay import replay
from posttrain.storage.store import Store
from posttrain.tasks.registry import get_domain, match_domains
from posttrain.values.generation import GenerationRequest, Message, PolicyVersion
from posttrain.values.image import Image, parts

CHART = "docs.chart.peak.bar"
DRAWING = "geometry.drawing.box.dims"


class _TextOnly:
    """A text-only policy (like TorchPolicy on a text model): it answers from the text it sees."""

    version = PolicyVersion("text-only")
    max_positions = None
    accepts_images = False
    seen: list[GenerationRequest] = []

    def render(self, request):
        return None

    def generate(self, requests):
        from posttrain.values.generation import Completion

        self.seen.extend(requests)
        plain_text(requests[0].messages)  # a text rendering refuses images
        return [Completion(text="Q1 2020", finish_reason="stop") for _ in requests]


def test_at_least_ten_image_domains_each_declaring_its_vision_needs():
    image = [d for d in match_domains("*") if d.needs_vision]
    assert len(image) >= 10
    assert {vision_mode(d) for d in image} <= {"fallback", "required"}
    assert vision_mode(get_domain("math.add.d2")) == "none"
    assert get_domain(DRAWING).tools[-1].returns_images


def test_chart_and_page_domains_pass_their_self_check():
    from posttrain.scheduling.domain_check import check_domains

    domains = [d for d in match_domains("docs.*") if d.needs_vision]
    report = check_domains(domains, per_domain=2)
    assert report.ok, [(f.domain, f.kind, f.detail) for f in report.failures[:5]]
    assert report.negative_fail_rate == 1.0 and report.tasks == 2 * len(domains) >= 2 * 29


@pytest.mark.slow
def test_the_same_task_renders_byte_identical_images():
    for name in (CHART, DRAWING, "docs.page.income-lines"):
        d = get_domain(name)
        first, again = d.images(d.task(3)), d.images(d.task(3))
        assert [i.data for i in first] == [i.data for i in again]
        assert first[0].sha256 != d.images(d.task(4))[0].sha256


def test_chart_prompts_hold_no_figure_the_chart_shows():
    d = get_domain("docs.chart.value.line")
    for seed in range(5):
        t = d.task(seed)
        assert t.reference["answer"] not in t.prompt.replace(t.reference["labels"][0], "")
        assert all(str(v) not in t.prompt.split("?")[0].split("USD millions.")[1] for v in t.reference["values"])


@pytest.mark.slow
def test_oracle_episodes_record_images_store_them_once_and_replay_identically(tmp_path):
    chart, drawing = get_domain(CHART), get_domain(DRAWING)
    task = chart.task(0)
    items = [(chart, task), (chart, task), (drawing, drawing.task(0))]
    trajs = run_episodes(items, ScriptedPolicy.oracle(), workers=1)
    assert [t.reward for t in trajs] == [1.0, 1.0, 1.0]
    first = trajs[0].turns[0].observation_images
    assert len(first) == 1 and first[0]["mime"] == "image/png"
    assert trajs[1].turns[0].observation_images == first  # same task -> same bytes
    geo = trajs[2]
    assert len(geo.turns[0].observation_images) == 1  # the target drawing
    assert len(geo.turns[2].observation_images) == 1  # the render tool's view, after the model call
    assert geo.turns[1].tool_results[0]["images"] == [geo.turns[2].observation_images[0]["sha256"]]
    store = Store(tmp_path / "store.sqlite")
    store.put_trajectories([(t, tk, None) for t, (_, tk) in zip(trajs, items)])
    assert store.image_stats()["images"] == 3 and store.image_stats()["refs"] == 4
    for t in trajs:
        result = replay(store, store.get_trajectory(t.id))
        assert result.matched, result.divergence
        assert result.images == sum(len(u.observation_images) for u in t.turns)


@pytest.mark.slow
def test_replay_says_so_when_an_image_differs(tmp_path):
    chart = get_domain(CHART)
    traj = run_episodes([(chart, chart.task(1))], ScriptedPolicy.oracle(), workers=1)[0]
    other = chart.images(chart.task(2))[0]
    traj.turns[0].observation_images = [other.ref()]
    traj.images = {other.sha256: other}
    store = Store(tmp_path / "store.sqlite")
    store.put_trajectory(traj, chart.task(1))
    result = replay(store, store.get_trajectory(traj.id))
    assert not result.matched and result.divergence["field"] == "observation_images"


def test_text_only_policy_gets_the_fallback_or_a_clear_refusal():
    chart, drawing = get_domain(CHART), get_domain(DRAWING)
    policy = _TextOnly()
    assert isinstance(policy, Policy)
    traj = run_episodes([(chart, chart.task(0))], policy, workers=1)[0]
    assert traj.status == "completed" and traj.turns[0].observation_images == []
    assert "The chart's data" in policy.seen[0].messages[0].content  # a plain str: the series as text
    assert for_policy(EnvConfig(), policy, [drawing]).text_only  # declared fallback: the statement
    refusing = type("D", (), {"needs_vision": True, "text_fallback": None, "name": "docs.x", "images": 1})()
    assert refused([refusing]) == ["docs.x"]
    with pytest.raises(VisionRequired, match="policy 'text-only' reads no images.*docs.x"):
        for_policy(EnvConfig(), policy, [refusing])
    img = chart.images(chart.task(0))[0]
    with pytest.raises(ValueError, match="renders text only.*1 image"):
        plain_text([Message("user", parts("look", [img]))])


class _Capture(BaseHTTPRequestHandler):
    bodies: list[dict] = []

    def log_message(self, *args):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).bodies.append(body)
        reply = {"id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
                 "choices": [{"index": 0, "finish_reason": "stop", "logprobs": None,
                              "message": {"role": "assistant", "content": "Q1 2020"}}]}
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def test_openai_chat_policy_sends_image_parts_as_data_uris():
    server = HTTPServer(("127.0.0.1", 0), _Capture)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        chart = get_domain(CHART)
        img: Image = chart.images(chart.task(0))[0]
        policy = OpenAIPolicy(OpenAIConfig(base_url=f"http://127.0.0.1:{server.server_port}/v1",
                                           model="m", api="chat", max_retries=0, return_token_ids=False))
        assert policy.accepts_images
        assert not OpenAIPolicy(OpenAIConfig(base_url="http://127.0.0.1:1/v1", model="m")).accepts_images
        out = policy.generate([GenerationRequest((Message("system", "be brief"),
                                                  Message("user", parts("which quarter?", [img]))))])
        assert out[0].text == "Q1 2020"
        sent = _Capture.bodies[-1]["messages"]
        assert sent[0] == {"role": "system", "content": "be brief"}
        assert sent[1]["content"][0] == {"type": "text", "text": "which quarter?"}
        part = sent[1]["content"][1]
        assert part["type"] == "image_url"
        assert Image.from_data_uri(part["image_url"]["url"]).sha256 == img.sha256
    finally:
        server.shutdown()
        server.server_close()
