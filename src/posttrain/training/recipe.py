"""The RL recipe on the shipped tiny model: GRPO rounds over the default mix, measured.

    .venv/bin/python -m posttrain.training.recipe                 # base eval, round 1, round 2
    .venv/bin/python -m posttrain.training.recipe --steps 20 --rounds 1 --eval-tasks 10

One loop, top to bottom: evaluate the base model; then per round, per step, draw
`prompts_per_step` train-split tasks from the mix, sample `group_size` episodes of each through
the episode runner, and hand the groups to the `Trainer`; checkpoint; evaluate. A round starts
from the previous round's checkpoint (a new `Trainer`, a new optimizer), so the versions read
base -> round-1/step-N -> round-2/step-N.

The budget is counted in steps, not seconds, so results do not depend on machine load. It
prints a table, then one JSON line (the numbers `models/README.md` reports).

What it is *not*: the `posttrain run` main job (scheduler, store, quotas); this is the same
trainer and runner in the smallest loop that shows RL working.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_MIX = (
    "text.reverse.l3,text.upper.l3,text.lower.l3,text.swapcase.l3,text.double.l3,text.sort.l3,"
    "text.first.l5,math.add.d1,math.max.d1,math.min.d1"
)
"""the trained domains (10): one domain of each op the base model knows well"""

HELD_OUT = (
    "text.reverse.l5,text.upper.l5,text.lower.l5,text.swapcase.l5,text.last.l5,text.vowels.l5,"
    "math.max.d2,math.min.d2"
)
"""in the pretraining corpus but never trained by RL (longer words and larger numbers of trained
ops, and ops not trained at all): their pass@1 is the forgetting check"""


@dataclass
class RecipeConfig:
    model: str = "models/tiny-base"
    """starting model directory (any HF causal LM, or a trainer checkpoint)"""
    out: str = "runs/recipe"
    """checkpoints go to <out>/round-<k>"""
    mix: str = DEFAULT_MIX
    """comma-separated domains trained on (train split)"""
    held_out: str = HELD_OUT
    """comma-separated domains only evaluated (eval split), to check for forgetting"""
    rounds: int = 2
    """GRPO rounds, each from the previous round's checkpoint"""
    steps: int = 200
    """trainer steps per round"""
    prompts_per_step: int = 32
    """tasks per step (groups)"""
    group_size: int = 8
    """samples per task (GRPO group)"""
    lr: float = 1e-4
    """AdamW learning rate (TrainerConfig.lr)"""
    kl_beta: float = 0.0
    """weight of the KL penalty to the round's starting weights (TrainerConfig.kl_beta)"""
    adaptive: bool = True
    """draw domains in proportion to their recent share of groups with a learning signal"""
    adaptive_floor: float = 0.1
    """added to every domain's weight, so that none is starved entirely"""
    max_tokens: int = 16
    """new tokens per completion"""
    eval_tasks: int = 50
    """eval-split tasks per domain"""
    eval_samples: int = 8
    """samples per eval task: pass@1 is their mean, pass@k uses k = eval_samples"""
    seed: int = 0
    """task draws and the trainer's RNG"""
    threads: int = 2
    """torch CPU threads"""


def _domains(names: str) -> list:
    from posttrain.tasks.registry import get_domain

    return [get_domain(n.strip()) for n in names.split(",") if n.strip()]


def train_round(cfg: RecipeConfig, start: str, round_index: int, mix: list) -> tuple[str, list[dict]]:
    """One GRPO round from `start`; returns (checkpoint dir, per-step metrics)."""
    from posttrain.rollout.runner import EpisodeSpec, run_episodes
    from posttrain.training.config import TrainerConfig
    from posttrain.training.trainer import Trainer
    from posttrain.values.generation import SamplingParams

    trainer = Trainer(start, TrainerConfig(lr=cfg.lr, kl_beta=cfg.kl_beta, run_name=f"round-{round_index}",
                                           seed=cfg.seed + round_index))
    sampling = SamplingParams(temperature=1.0, max_tokens=cfg.max_tokens)
    rng = random.Random(f"{cfg.seed}/round-{round_index}")
    # Share of each domain's recent groups that carried a learning signal (rewards not all
    # equal). With `adaptive`, domains are drawn in proportion to it (plus a floor), so a domain
    # the policy has saturated stops taking batch slots that would be filtered out anyway.
    signal = {d.name: 1.0 for d in mix}
    history = []
    for step in range(cfg.steps):
        weights = [signal[d.name] + cfg.adaptive_floor if cfg.adaptive else 1.0 for d in mix]
        picked = rng.choices(mix, weights=weights, k=cfg.prompts_per_step)
        specs = []
        for i, domain in enumerate(picked):
            task = domain.task(rng.randrange(2**31), "train")
            specs += [EpisodeSpec(domain, task, group_id=f"r{round_index}-s{step}-{i}")] * cfg.group_size
        trajectories = run_episodes(specs, trainer.policy(), sampling)
        groups: dict[str, list] = {}
        for t in trajectories:
            groups.setdefault(t.group_id, []).append(t)
        for group in groups.values():
            rewards = [t.reward for t in group if t.trainable]
            live = float(len(rewards) >= 2 and max(rewards) > min(rewards))
            signal[group[0].domain] = 0.8 * signal[group[0].domain] + 0.2 * live
        metrics = trainer.step(list(groups.values()))
        history.append(metrics)
        if step % 10 == 0 or step == cfg.steps - 1:
            print(f"round {round_index} step {step:4d}  reward {metrics['reward_mean']:.3f}  "
                  f"zero-var {metrics['share_zero_variance']:.2f}  kl {metrics['kl']:.4f}  "
                  f"clip {metrics['clip_fraction']:.3f}  entropy {metrics['entropy']:.3f}  "
                  f"grad {metrics['grad_norm']:.3f}", flush=True)
    directory = str(Path(cfg.out) / f"round-{round_index}")
    trainer.save(directory)
    return directory, history


def summarize(base: dict, final: dict, trained: list[str], held: list[str]) -> dict[str, Any]:
    def mean(rows: dict, names: list[str], key: str) -> float:
        return sum(rows[n][key] for n in names) / max(len(names), 1)

    return {
        "trained_base_pass1": mean(base, trained, "pass1"),
        "trained_base_passk": mean(base, trained, "passk"),
        "trained_final_pass1": mean(final, trained, "pass1"),
        "trained_final_greedy": mean(final, trained, "greedy"),
        "held_out_base_pass1": mean(base, held, "pass1"),
        "held_out_final_pass1": mean(final, held, "pass1"),
    }


def main(cfg: RecipeConfig) -> dict[str, Any]:
    import torch

    from posttrain.policies.local import TorchPolicy
    from posttrain.training.passk import evaluate

    torch.set_num_threads(cfg.threads)
    mix, held = _domains(cfg.mix), _domains(cfg.held_out)
    every = mix + held
    trained, held_names = [d.name for d in mix], [d.name for d in held]

    def run_eval(path: str) -> dict:
        return evaluate(TorchPolicy(path, device="cpu"), every, n_tasks=cfg.eval_tasks,
                        n_samples=cfg.eval_samples, max_tokens=cfg.max_tokens)

    t0 = time.perf_counter()
    evals = {"base": run_eval(cfg.model)}
    start, rounds = cfg.model, []
    for r in range(1, cfg.rounds + 1):
        t_round, cpu_round = time.perf_counter(), time.process_time()
        start, history = train_round(cfg, start, r, mix)
        train_s, train_cpu_s = time.perf_counter() - t_round, time.process_time() - cpu_round
        evals[f"round-{r}"] = run_eval(start)
        summary = summarize(evals["base"], evals[f"round-{r}"], trained, held_names)
        rounds.append({"round": r, "checkpoint": start, "steps": cfg.steps, "train_s": round(train_s, 1),
                       "train_cpu_s": round(train_cpu_s, 1),
                       **{k: round(v, 4) for k, v in summary.items()}})

    k = cfg.eval_samples
    print(f"\n{'domain':18s} {'base p@1':>9s} {f'base p@{k}':>9s} " +
          " ".join(f"{f'r{r} p@1':>8s}" for r in range(1, cfg.rounds + 1)))
    for name in trained + held_names:
        tag = "" if name in trained else "  (held out)"
        row = " ".join(f"{evals[f'round-{r}'][name]['pass1']:8.3f}" for r in range(1, cfg.rounds + 1))
        base = evals["base"][name]
        print(f"{name:18s} {base['pass1']:9.3f} {base['passk']:9.3f} {row}{tag}")
    result = {"config": dataclasses.asdict(cfg), "rounds": rounds,
              "wall_s": round(time.perf_counter() - t0, 1), "evals": evals}
    Path(cfg.out).mkdir(parents=True, exist_ok=True)
    (Path(cfg.out) / "recipe.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({"rounds": rounds, "wall_s": result["wall_s"]}))
    return result


def parse_args(argv: list[str] | None = None) -> RecipeConfig:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for f in dataclasses.fields(RecipeConfig):
        flag = f"--{f.name.replace('_', '-')}"
        if isinstance(f.default, bool):  # --adaptive / --no-adaptive
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=f.default)
        else:
            parser.add_argument(flag, type=type(f.default), default=f.default, help=f"default: {f.default}")
    return RecipeConfig(**vars(parser.parse_args(argv)))


if __name__ == "__main__":
    main(parse_args())
