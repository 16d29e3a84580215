"""`posttrain run` with an image-text-to-text model (the tiny random LLaVA of `tests/tiny_vlm.py`,
written to a directory): evaluations, training episodes and checkpoints use the `VisionPolicy`,
the sampler follows the trainer's weights, a finished run resumes to train further, and the
settings a vision model cannot run under are refused naming the field."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace

import pytest
from rich.console import Console

from posttrain.pipeline.config import ConfigError, load_config
from posttrain.pipeline.main import Job
from posttrain.tasks.registry import add_domains, get_domain
from posttrain.verifiers.base import verdict
from tests.tiny_vlm import tiny_vlm

CHART = "docs.chart.peak.bar"
EVEN = CHART + ".even-length"


@dataclass(frozen=True)
class EvenLength:
    """Passes an answer of an even number of characters. A random model never reads a chart
    right, so every GRPO group of the real domain has one reward and trains nothing; this one
    shows the same charts and pays about half of the random answers, so the steps do update."""

    name: str = "test-even-length"
    version: str = "1"
    needs_sandbox: bool = False

    def verify(self, task, outcome):
        return verdict(self, len(outcome.answer or "") % 2 == 0)


@pytest.fixture
def even_chart():
    chart = get_domain(CHART)
    add_domains([replace(chart, name=EVEN, verifier=EvenLength(),
                         generate=lambda seed, split: chart.generate(seed, split).model_copy(
                             update={"domain": EVEN, "key": f"{EVEN}/{split}/{seed}"}))],
                "test_vision_run")
    return EVEN


CONFIG = """
name = "vis"
runs_dir = "{runs}"
steps = 2
checkpoint_every = 1
[model]
path = "{model}"
[domains]
train = ["{chart}"]
heldout = []
[rollout]
group_size = 4
signal_groups = 1
groups_per_step = 2
max_tokens = 4
{extra}
[eval]
tasks_per_domain = 2
samples = 1
[trainer]
lr = 1e-2
weight_decay = 0.0
"""


def _model(tmp_path):
    vlm = tiny_vlm()
    path = tmp_path / "tiny-vlm"
    vlm.model.save_pretrained(path)
    vlm.processor.save_pretrained(path)
    return path


def _config(tmp_path, model, extra="", domain=CHART):
    path = tmp_path / "vis.toml"
    path.write_text(CONFIG.format(runs=tmp_path / "runs", model=model, chart=domain, extra=extra))
    return path


def _weights(directory):
    from safetensors.torch import load_file

    return load_file(directory / "model.safetensors")


@pytest.mark.slow
def test_a_vision_model_runs_end_to_end_and_resumes(tmp_path, even_chart):
    import torch

    from posttrain.storage.store import Store

    model = _model(tmp_path)
    cfg = _config(tmp_path, model, domain=even_chart)
    quiet = Console(file=open(tmp_path / "console.txt", "w"), width=120)  # noqa: SIM115 - closed by the test's end
    summary = Job(load_config(cfg), console=quiet).run()
    assert summary["steps_done"] == 2 and not summary["untrustworthy"], summary

    run = tmp_path / "runs" / "vis"
    before = json.loads((run / "evals" / "before.json").read_text())
    after = json.loads((run / "evals" / "after.json").read_text())
    assert before["policy"] == "tiny-vlm" and after["policy"] == "vis/step-2"
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and all(r["updated"] == 1 for r in rows), rows
    assert (run / "report.html").is_file() and (run / "summary.json").is_file()

    ckpt = run / "checkpoints" / "step-2"
    assert (ckpt / "processor_config.json").is_file()  # the processor travels with the weights
    start, trained = _weights(model), _weights(ckpt)
    assert set(start) == set(trained)
    changed = {k for k in start if not torch.equal(start[k], trained[k])}
    assert any("language_model" in k for k in changed) and any("multi_modal_projector" in k for k in changed)

    with Store.for_run_dir(run, readonly=True) as store:
        episodes = list(store.trajectories(run_id="vis"))
        versions = {v["name"]: v for v in store.policy_versions()}
    # the second step's groups were sampled with the first step's weights: the publisher moved them
    assert {t.policy_version for t in episodes} >= {"tiny-vlm", "vis/step-1"}
    assert all(t.status != "infra_error" for t in episodes)
    assert all(t.images and t.turns[0].observation_images for t in episodes)  # the charts were shown
    assert versions["vis/step-2"]["parent"] == "tiny-vlm"

    # resumed from the step-2 checkpoint (processor included) to train one step further
    summary = Job(load_config(cfg, {"steps": 3}), console=quiet).run()
    assert summary["steps_done"] == 3
    assert json.loads((run / "evals" / "after.json").read_text())["policy"] == "vis/step-3"
    assert not torch.equal(_weights(run / "checkpoints" / "step-3")["multi_modal_projector.linear_1.weight"],
                           trained["multi_modal_projector.linear_1.weight"])


@pytest.mark.parametrize("extra, overrides, fragment", [
    ('mode = "fast"', {}, "[rollout] mode = 'fast'"),
    ('engine = "openai:http://127.0.0.1:9/v1#m"', {}, "[rollout] engine = 'openai:"),
    ("[trainer.lora]\nr = 4", {}, "[trainer] lora"),
    ("", {"trainer.engine": "fsdp"}, "[trainer] engine = 'fsdp'"),
])
def test_settings_a_vision_model_cannot_run_under_are_refused(tmp_path, extra, overrides, fragment):
    model = _model(tmp_path)
    with pytest.raises(ConfigError) as e:
        Job(load_config(_config(tmp_path, model, extra), overrides))
    assert fragment in str(e.value) and "image-text-to-text" in str(e.value)


def test_the_publisher_hands_a_vision_trainer_s_weights_to_a_vision_policy():
    import torch

    from posttrain.policies.vision import VisionPolicy
    from posttrain.training.config import TrainerConfig
    from posttrain.training.publish import PolicyPublisher
    from posttrain.training.trainer import Trainer

    trainer = Trainer(tiny_vlm(), TrainerConfig(run_name="vis"))
    shared, copied = PolicyPublisher(trainer, copy=False), PolicyPublisher(trainer, copy=True)
    assert isinstance(shared._policy, VisionPolicy) and shared._policy.model is trainer.model
    assert isinstance(copied._policy, VisionPolicy) and copied._policy.model is not trainer.model
    assert copied.accepts_images and copied.max_positions == 1024
    with torch.no_grad():  # what an optimizer step does, then the step count it would advance
        next(trainer.model.parameters()).add_(1.0)
    trainer.step_count = 1
    assert copied.publish().name == "vis/step-1" == copied.version.name == shared.publish().name
    assert all(torch.equal(a, b) for a, b in zip(copied._policy.model.state_dict().values(),
                                                  trainer.model.state_dict().values()))
    with pytest.raises(ValueError, match="'standard' mode only"):
        PolicyPublisher(trainer, copy=True, mode="fast")
