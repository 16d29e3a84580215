"""The KL term extended to domains a step does not sample (`TrainerConfig.kl_anchor_domains`)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from pydantic import ValidationError

from posttrain.policies.local import weights_hash
from posttrain.training.batch import Sample, sequence_logprobs
from posttrain.training.config import TrainerConfig
from posttrain.training.replay import KlAnchor
from posttrain.training.trainer import Trainer
from tests.test_training_replay import MODEL, sampled_group, traj


@pytest.fixture(autouse=True)
def one_thread():
    torch.set_num_threads(1)


def test_the_first_trainable_samples_of_each_domain_are_kept_and_drawn_least_recent_first():
    a = KlAnchor(per_domain=2)
    pictured = traj("g", True)
    pictured.turns[0].observation_images = [{"sha256": "0" * 64, "mime": "image/png", "bytes": 1}]
    first = [traj("b", None), traj("b", False, tokens=(7,)), traj("b", True), traj("b", False)]
    assert a.observe([first, [traj("a", True)] * 3, [traj("c", None)] * 2, [pictured] * 2, []]) == 2
    assert a.samples["b"] == first[1:3]             # the infra error is not a sample of the policy
    assert len(a.samples["a"]) == 2 and set(a.samples) == {"a", "b"}
    assert a.observe([[traj("b", True, tokens=(9,))] * 2, [traj("d", False)]]) == 1
    assert a.samples["b"] == first[1:3]             # the first seen stay: nearest the reference
    assert [t.domain for t in a.draw(2, 1)] == ["a", "a", "b", "b"]
    assert [t.domain for t in a.draw(2, 2)] == ["d", "a", "a"]
    state = a.state_dict()
    again = KlAnchor(per_domain=2)
    again.load_state_dict(state)
    assert again.state_dict() == state
    assert [t.domain for t in again.draw(1, 3)] == [t.domain for t in a.draw(1, 3)] == ["b", "b"]
    assert a.draw(0, 4) == []


def test_an_anchor_needs_the_kl_term():
    with pytest.raises(ValidationError, match="kl_anchor_domains"):
        TrainerConfig(kl_anchor_domains=4)
    with pytest.raises(ValidationError, match="kl_anchor_samples"):
        TrainerConfig(kl_beta=0.1, kl_anchor_domains=4, kl_anchor_samples=0)


def k3(trainer: Trainer, samples: list[Sample]) -> float:
    """mean k3 KL to the reference over the tokens of `samples`"""
    with torch.no_grad():
        new = sequence_logprobs(trainer.model, samples, temperature=1.0)[0]
        ref = sequence_logprobs(trainer.reference, samples, temperature=1.0)[0]
    d = ref - new
    return float((d.exp() - d - 1).mean())


def test_anchored_domains_are_held_to_the_reference_and_resume_exactly(tmp_path):
    cfg = TrainerConfig(lr=3e-3, kl_beta=1.0, kl_anchor_domains=1, kl_anchor_samples=4, loss_agg="sequence")
    trainer = Trainer(MODEL, cfg)
    held = sampled_group(trainer, "upper abc=", "held", [0] * 4)   # no reward spread: no gradient of its own
    m0 = trainer.step([held, sampled_group(trainer, "reverse abc=", "learning", [1, 0, 1, 0], seed=10)])
    assert (m0["anchor_trajectories"], m0["anchor_new"], m0["anchor_domains"]) == (0, 2, 2)
    assert "anchor_kl" not in m0
    kept = [Sample(t.turns[0].prompt_token_ids, t.turns[0].token_ids, None, 0.0, 0) for t in held]
    ckpt = trainer.save(tmp_path / "ckpt")

    # a step whose only group has no reward spread: the anchor alone moves the weights back
    flat = sampled_group(trainer, "lower ABC=", "flat", [0] * 4, seed=20)
    m1 = trainer.step([flat])
    assert (m1["anchor_trajectories"], m1["updated"]) == (4, 1)     # "held" sorts first of the two
    assert m1["anchor_kl"] > 0                                      # step 0's update moved it
    after = weights_hash(trainer.model)
    resumed = Trainer.resume(ckpt)
    assert set(resumed.anchor.samples) == {"held", "learning"}
    resumed.step([flat])
    assert weights_hash(resumed.model) == after                     # the same anchor, the same update
    off = Trainer.resume(ckpt, replace(resumed.config, kl_anchor_domains=0))
    assert off.step([flat])["updated"] == 0

    # the same update of another domain with and without the anchor: the held domain's kept
    # samples stay nearer the reference with it (one optimizer state for both)
    other = [sampled_group(trainer, f"reverse {w}=", "learning", [0, 1, 0, 1], seed=40 + i)
             for i, w in enumerate(("xyz", "pqr", "klm"))]
    on = Trainer.resume(ckpt)
    off = Trainer.resume(ckpt, replace(on.config, kl_anchor_domains=0))
    first_on, first_off = on.step(other), off.step(other)
    # the `kl` metric reads the step's own samples: the same with the anchored ones in the loss
    assert first_on["kl"] == pytest.approx(first_off["kl"], rel=1e-6) and first_on["kl"] > 0
    assert first_on["anchor_kl"] > 0
    for _ in range(2):
        on.step(other)
        off.step(other)
    assert k3(on, kept) < k3(off, kept)


def test_the_anchor_weight_scales_the_anchored_samples_kl_term_alone(tmp_path):
    cfg = TrainerConfig(lr=3e-3, kl_beta=1.0, kl_anchor_domains=1, kl_anchor_samples=4, loss_agg="sequence")
    trainer = Trainer(MODEL, cfg)
    held = sampled_group(trainer, "upper abc=", "held", [0] * 4)
    trainer.step([held, sampled_group(trainer, "reverse abc=", "learning", [1, 0, 1, 0], seed=10)])
    ckpt = trainer.save(tmp_path / "ckpt")
    other = [sampled_group(trainer, f"reverse {w}=", "learning", [0, 1, 0, 1], seed=40 + i)
             for i, w in enumerate(("xyz", "pqr", "klm"))]
    steps = {w: Trainer.resume(ckpt, replace(trainer.config, kl_anchor_weight=w)) for w in (1.0, 2.0, 4.0)}
    metrics = {w: t.step(other) for w, t in steps.items()}
    assert all(m["anchor_trajectories"] == 4 and m["updated"] == 1 for m in metrics.values())
    # the step's own policy gradient and KL, and the anchored samples' KL before the update: the same
    for key in ("pg_loss", "kl", "anchor_kl"):
        assert metrics[4.0][key] == pytest.approx(metrics[1.0][key], rel=1e-6), key
    # the loss grows linearly in the weight: only the anchored samples' KL term is multiplied
    one, two, four = (metrics[w]["loss"] for w in (1.0, 2.0, 4.0))
    assert two > one and (four - one) == pytest.approx(3 * (two - one), rel=1e-4)
    assert len({weights_hash(t.model) for t in steps.values()}) == 3
    with pytest.raises(ValidationError, match="kl_anchor_weight"):
        TrainerConfig(kl_beta=0.1, kl_anchor_domains=4, kl_anchor_weight=0)
