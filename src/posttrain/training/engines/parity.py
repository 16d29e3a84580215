"""The acceptance check of a trainer engine: its first steps against the single-process engine's.

    python -m posttrain.training.engines.parity --engine local --out local.json
    torchrun --nproc-per-node 2 -m posttrain.training.engines.parity --engine fsdp --out fsdp.json

Both runs train the shipped tiny model on the *same* batches (groups sampled once from the base
model with fixed seeds and graded by exact match, so the data does not depend on the engine) and
write each step's loss and gradient norm (rank 0). `compare` gives the largest relative
difference over the steps: `benchmarks/engines.py` reports it as `fsdp_loss_rel_diff`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

TASKS = (("reverse abc=", "cba"), ("upper xyz=", "XYZ"), ("sort dbca=", "abcd"), ("reverse pqr=", "rqp"),
         ("upper abc=", "ABC"), ("sort cab=", "abc"))
MODEL = Path(__file__).resolve().parents[4] / "models" / "tiny-base"


def batches(model: str | Path, steps: int, group_size: int = 6) -> list[list[list[Any]]]:
    """`steps` batches of graded groups, sampled from the base model with fixed seeds."""
    from posttrain.policies.local import TorchPolicy
    from posttrain.values.generation import GenerationRequest, Message, SamplingParams
    from posttrain.values.trajectory import Trajectory, Turn
    from posttrain.values.verdict import Verdict

    policy = TorchPolicy(model, device="cpu")
    out = []
    for step in range(steps):
        groups = []
        for t, (prompt, good) in enumerate(TASKS):
            reqs = [GenerationRequest((Message("user", prompt),), SamplingParams(
                temperature=1.0, max_tokens=6, stop=("\n",), seed=1000 * step + 10 * t + i))
                for i in range(group_size)]
            group = []
            for c in policy.generate(reqs):
                turn = Turn(index=0, observation="", action=c.text, prompt_token_ids=c.prompt_token_ids,
                            token_ids=c.token_ids, logprobs=c.logprobs, finish_reason=c.finish_reason)
                reward = float(c.text == good)
                group.append(Trajectory(task_key=prompt, task_hash=prompt, domain="parity", split="train",
                                        policy_version="base", status="completed", turns=[turn],
                                        reward=reward, sampling={"temperature": 1.0},
                                        verdict=Verdict(passed=bool(reward), score=reward)))
            # a group whose rewards are all equal teaches nothing: give it one success by hand
            if len({tr.reward for tr in group}) == 1:
                group[0].reward = 1.0 - float(group[0].reward or 0.0)
            groups.append(group)
        out.append(groups)
    return out


def run(engine: str, steps: int, model: str | Path = MODEL, micro_batch_size: int = 8,
        micro_batch_tokens: int = 0) -> list[dict[str, float]]:
    import torch

    from posttrain.training.config import TrainerConfig
    from posttrain.training.trainer import Trainer

    torch.set_num_threads(1)
    data = batches(model, steps)
    # two epochs per step and the sampler's (base model's) log-probs as the ratio's denominator:
    # from the second update on the ratio moves off 1 and the clipped loss is far from 0, and a
    # KL penalty exercises the (sharded) reference model
    trainer = Trainer(model, TrainerConfig(lr=1e-3, engine=engine, micro_batch_size=micro_batch_size,
                                           micro_batch_tokens=micro_batch_tokens, ppo_epochs=2, kl_beta=0.05))
    rows = []
    for groups in data:
        m = trainer.step(groups)
        rows.append({"step": m["step"], "loss": m["loss"], "grad_norm": m["grad_norm"], "tokens": m["tokens"],
                     "micro_batches": len(trainer.engine.micro_batches(
                         [len(t.turns[0].prompt_token_ids or []) + len(t.turns[0].token_ids or [])
                          for g in groups for t in g], micro_batch_size, micro_batch_tokens))})
    return rows


def compare(a: list[dict[str, float]], b: list[dict[str, float]]) -> float:
    """The largest relative difference of loss or gradient norm over the steps."""
    if len(a) != len(b):
        raise ValueError(f"parity: {len(a)} steps vs {len(b)}")
    worst = 0.0
    for x, y in zip(a, b):
        for key in ("loss", "grad_norm"):
            worst = max(worst, abs(x[key] - y[key]) / max(abs(x[key]), abs(y[key]), 1e-12))
    return worst


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--engine", default="local", choices=("local", "fsdp"))
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--model", default=str(MODEL))
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    rows = run(args.engine, args.steps, args.model)
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_rank() == 0:
        Path(args.out).write_text(json.dumps(rows) + "\n")
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
