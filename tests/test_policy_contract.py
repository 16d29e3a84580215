"""The `Policy` protocol declares everything callers use (version, context limit, rendering), and
every policy in the library provides all of it, so no caller has to probe with getattr/hasattr."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from posttrain.evaluation.policy import SeededPolicy
from posttrain.policies.base import Policy
from posttrain.policies.openai_compat import OpenAIConfig, OpenAIPolicy
from posttrain.policies.scripted import ScriptedPolicy
from posttrain.rollout.replay import _ReplayPolicy
from posttrain.scheduling.sim import SimGenerator
from posttrain.training.publish import PolicyPublisher as SyncedPolicy
from posttrain.values.generation import GenerationRequest, Message, SamplingParams

SRC = Path(__file__).resolve().parents[1] / "src" / "posttrain"
REQUEST = GenerationRequest((Message("user", "37+48="),), SamplingParams())


class _Trainer:
    """What SyncedPolicy uses of a trainer when it shares the trained module."""

    vision = None  # a text model's trainer (a vision one publishes its `vision_policy()`)

    def __init__(self, policy: Policy) -> None:
        self._policy = policy

    def policy(self, **kwargs: object) -> Policy:  # the mode (kwargs) is a TorchPolicy's
        return self._policy


def _text_only_policies() -> dict[str, Policy]:
    scripted = ScriptedPolicy.playing(["x"], "scripted:test")
    return {
        "scripted": scripted,
        "seeded": SeededPolicy(scripted, base_seed=1),
        "synced": SyncedPolicy(_Trainer(scripted), copy=False),
        "replay": _ReplayPolicy([], "replay:test"),
        "sim": SimGenerator(tokens_per_s=1000.0),
        "openai": OpenAIPolicy(OpenAIConfig(base_url="http://127.0.0.1:9/v1", model="m", max_retries=0)),
    }


TEXT_ONLY = ("openai", "replay", "scripted", "seeded", "sim", "synced")
"""the names of `_text_only_policies`, spelled out: building them at collection imports the
OpenAI client in every test process"""


@pytest.mark.parametrize("name", TEXT_ONLY)
def test_every_policy_declares_the_whole_contract(name):
    policies = _text_only_policies()
    assert tuple(sorted(policies)) == TEXT_ONLY  # every policy built is checked
    policy = policies[name]
    assert isinstance(policy, Policy)
    # none of these has a tokenizer: they say so instead of leaving the members out
    assert policy.max_positions is None
    assert policy.render(REQUEST) is None


def test_a_tokenizer_makes_a_policy_measurable(tiny_policy):
    local = tiny_policy
    assert isinstance(local, Policy)
    assert local.max_positions is not None and local.max_positions > 0
    ids = local.render(REQUEST)
    assert ids and len(ids) < local.max_positions
    remote = OpenAIPolicy(OpenAIConfig(base_url="http://127.0.0.1:9/v1", model="m"), tokenizer=local.tokenizer)
    assert remote.render(REQUEST) == ids  # what the server's model would see
    # wrappers pass the model's figures through
    for wrapper in (SeededPolicy(local, base_seed=3), SyncedPolicy(_Trainer(local), copy=False)):
        assert wrapper.max_positions == local.max_positions and wrapper.render(REQUEST) == ids


def test_no_caller_probes_a_policy():
    """getattr/hasattr on something named like a policy means the protocol is missing a member."""
    probes = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id in ("getattr", "hasattr") and node.args):
                target = ast.unparse(node.args[0])
                if "policy" in target.lower():
                    probes.append(f"{path.relative_to(SRC)}:{node.lineno}: {ast.unparse(node)}")
    assert not probes, "policy probes:\n" + "\n".join(probes)
