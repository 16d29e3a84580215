"""The GRPO trainer on real models: what it trains on, what it leaves out, what it produces."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from posttrain.policies.local import TorchPolicy, weights_hash
from posttrain.training.batch import Sample, sequence_logprobs
from posttrain.training.config import TrainerConfig
from posttrain.training.trainer import Trainer
from posttrain.values.generation import GenerationRequest, Message, SamplingParams
from posttrain.values.trajectory import ErrorInfo, Trajectory, Turn
from posttrain.values.verdict import Verdict

MODEL = Path(__file__).resolve().parents[1] / "models" / "tiny-base"


@pytest.fixture(autouse=True)
def one_thread():
    torch.set_num_threads(1)


def sample_group(policy: TorchPolicy, prompt: str, n: int = 6, temperature: float = 1.0, seed: int = 0):
    requests = [GenerationRequest((Message("user", prompt),), SamplingParams(
        temperature=temperature, max_tokens=6, stop=("\n",), seed=seed + i)) for i in range(n)]
    return policy.generate(requests)


def as_trajectory(c, reward: float | None, status: str = "completed", temperature: float = 1.0) -> Trajectory:
    turn = Turn(index=0, observation="", action=c.text, prompt_token_ids=c.prompt_token_ids,
                token_ids=c.token_ids, logprobs=c.logprobs, finish_reason=c.finish_reason)
    if status == "infra_error":
        return Trajectory(task_key="k", task_hash="h", domain="d", split="train", policy_version="v",
                          status=status, turns=[turn], sampling={"temperature": temperature},
                          error=ErrorInfo("SandboxError", "died", where="sandbox"))
    return Trajectory(task_key="k", task_hash="h", domain="d", split="train", policy_version="v",
                      status=status, turns=[turn], reward=reward, sampling={"temperature": temperature},
                      verdict=Verdict(passed=bool(reward), score=float(reward)))


def graded(completions, good: str) -> list[Trajectory]:
    return [as_trajectory(c, float(c.text == good)) for c in completions]


def test_infra_errors_and_zero_variance_groups_are_counted_and_never_trained():
    trainer = Trainer(MODEL, TrainerConfig(lr=1e-2))
    cs = sample_group(trainer.policy(), "reverse abc=")
    before = weights_hash(trainer.model)
    metrics = trainer.step([
        [as_trajectory(c, None, "infra_error") for c in cs],         # all infra errors
        [as_trajectory(c, 1.0) for c in cs],                          # zero variance
    ])
    assert metrics["infra_errors"] == len(cs) and metrics["groups_zero_variance"] == 1
    assert metrics["share_zero_variance"] == 0.5 and metrics["groups_too_small"] == 1
    assert metrics["updated"] == 0 and metrics["tokens"] == 0
    assert weights_hash(trainer.model) == before  # nothing to learn from: weights untouched

    # the same learnable group, with and without infra errors beside it: identical update
    learnable = [as_trajectory(c, float(i % 2)) for i, c in enumerate(cs)]
    with_infra = Trainer(MODEL, TrainerConfig(lr=1e-2))
    m = with_infra.step([learnable + [as_trajectory(c, None, "infra_error") for c in cs[:3]]])
    plain = Trainer(MODEL, TrainerConfig(lr=1e-2))
    plain.step([learnable])
    assert m["infra_errors"] == 3 and m["samples"] == len(learnable)
    assert weights_hash(with_infra.model) == weights_hash(plain.model)


@pytest.mark.slow
def test_steps_raise_the_rewarded_completion():
    # old log-probs recomputed each step: the same group can be stepped on repeatedly, on-policy
    trainer = Trainer(MODEL, TrainerConfig(lr=3e-4, micro_batch_size=4, old_logprobs="recompute"))
    probe = sample_group(trainer.policy(), "upper abc=", n=12, temperature=1.0)
    counts = {c.text: sum(d.text == c.text for d in probe) for c in probe}
    assert len(counts) > 1, "the base model should not be deterministic on this prompt at T=1"
    rare = min(sorted(counts), key=counts.get)  # reward an unlikely answer: room to rise
    good = next(c for c in probe if c.text == rare)
    target = Sample(good.prompt_token_ids, good.token_ids, None, 0.0, 0)

    def logp() -> float:
        with torch.no_grad():
            return float(sequence_logprobs(trainer.model, [target], temperature=1.0)[0].sum())

    start = logp()
    group = graded(probe, rare)
    for _ in range(4):
        metrics = trainer.step([group])
        assert metrics["updated"] == 1 and metrics["groups_used"] == 1
    assert logp() > start + 0.5
    assert metrics["grad_norm"] > 0 and metrics["entropy"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("loss_agg", ["token", "sequence"])
def test_gradient_accumulation_is_exact(loss_agg):
    base = TorchPolicy(MODEL, device="cpu")
    groups = [graded(sample_group(base, p, n=6, seed=7), good) for p, good in
              (("reverse abc=", "cba"), ("upper xyz=", "XYZ"), ("sort dbca=", "abcd"))]
    grads = []
    for micro in (1, 5, 64):
        trainer = Trainer(MODEL, TrainerConfig(micro_batch_size=micro, loss_agg=loss_agg, max_grad_norm=0.0))
        trainer.optimizer.step = lambda: None  # keep the accumulated gradient to compare it
        trainer.step(groups)
        grads.append(torch.cat([p.grad.flatten() for p in trainer.model.parameters()]))
    assert grads[0].abs().max() > 1e-3
    for other in grads[1:]:
        assert torch.allclose(grads[0], other, atol=1e-5, rtol=1e-4)


def test_sampling_temperature_must_match_the_trainer():
    trainer = Trainer(MODEL, TrainerConfig(temperature=1.0))
    cs = sample_group(trainer.policy(), "upper abc=", temperature=0.7)
    group = [as_trajectory(c, float(i % 2), temperature=0.7) for i, c in enumerate(cs)]
    with pytest.raises(ValueError, match="sampled at temperature 0.7.*TrainerConfig.temperature is 1.0"):
        trainer.step([group])


def test_turns_without_token_ids_are_skipped_and_counted():
    trainer = Trainer(MODEL, TrainerConfig())
    cs = sample_group(trainer.policy(), "upper abc=")
    group = [as_trajectory(c, float(i % 2)) for i, c in enumerate(cs)]
    for t in group[:2]:
        t.turns[0].token_ids = None
    metrics = trainer.step([group])
    assert metrics["skipped_turns"] == 2 and metrics["samples"] == len(group) - 2


@pytest.mark.slow
def test_lineage_across_rounds_and_checkpoints_load_as_policies(tmp_path):
    round1 = Trainer(MODEL, TrainerConfig(run_name="round-1", lr=1e-3))
    base_name = round1.version.name
    cs = sample_group(round1.policy(), "reverse abc=")
    round1.step([[as_trajectory(c, float(i % 2)) for i, c in enumerate(cs)]])
    v1 = round1.version
    assert (v1.name, v1.parent) == ("round-1/step-1", base_name)
    ckpt = round1.save(tmp_path / "round-1")
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp dirs left

    loaded = TorchPolicy(ckpt, device="cpu")
    assert (loaded.version.name, loaded.version.parent) == (v1.name, base_name)
    assert loaded.version.weights_hash == v1.weights_hash
    round2 = Trainer(ckpt, TrainerConfig(run_name="round-2", lr=1e-3))
    cs = sample_group(round2.policy(), "reverse abc=")
    round2.step([[as_trajectory(c, float(i % 2)) for i, c in enumerate(cs)]])
    assert (round2.version.name, round2.version.parent) == ("round-2/step-1", "round-1/step-1")
    assert round2.policy().generate([GenerationRequest((Message("user", "1+1="),))])[0].token_ids


@pytest.mark.slow
def test_random_llama_trains_with_kl_clipping_and_recomputed_old_logprobs(tmp_path):
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(MODEL)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         eos_token_id=tok.eos_token_id)
    LlamaForCausalLM(config).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    trainer = Trainer(tmp_path, TrainerConfig(lr=5e-2, kl_beta=0.1, ppo_epochs=3, old_logprobs="recompute",
                                              micro_batch_size=3))
    cs = sample_group(trainer.policy(), "upper abc=", n=6)
    group = [as_trajectory(c, float(i % 2)) for i, c in enumerate(cs)]
    m1 = trainer.step([group])
    m2 = trainer.step([group])  # the same samples again: now off-policy, the ratio moves
    assert m1["updated"] == 1 and m1["old_logprobs_from_sampler"] == 0.0
    assert m2["kl"] > 0 and m2["clip_fraction"] > 0 and m2["ratio_max"] != 1.0
    assert trainer.reference is not None
    ckpt = trainer.save(tmp_path / "ckpt")
    assert (ckpt / "reference" / "config.json").is_file()
    resumed = Trainer.resume(ckpt)
    assert resumed.reference is not None and resumed.version == trainer.version


def test_shared_prompt_pass_matches_whole_sequences():
    """Each distinct prompt run once (its cache copied to its group) gives the same log-probs and
    gradients as running every sequence whole."""
    policy = TorchPolicy(MODEL, device="cpu")
    samples = [Sample(c.prompt_token_ids, c.token_ids, None, 0.0, i)
               for i, c in enumerate(sample_group(policy, "reverse abc=", n=4) + sample_group(policy, "1+1=", n=3))]
    model = policy.model.train()
    grads = []
    for share in (True, False):
        logp, entropy = sequence_logprobs(model, samples, temperature=0.9, with_entropy=True, share_prompts=share)
        assert logp.shape[0] == sum(len(s.completion_ids) for s in samples) == entropy.shape[0]
        grads.append((logp.detach(), torch.autograd.grad(logp.sum(), list(model.parameters()))))
    assert torch.allclose(grads[0][0], grads[1][0], atol=1e-5)
    for a, b in zip(grads[0][1], grads[1][1]):
        assert torch.allclose(a, b, atol=1e-4)
