"""Experiment tracking overhead: what `[logging]` adds to a training step.

    .venv/bin/python benchmarks/tracking.py                       # TensorBoard (the default)
    .venv/bin/python benchmarks/tracking.py --backends tensorboard,wandb,mlflow

A real GRPO update of the shipped tiny model on the default job's step shape (32 groups x 8
samples of the default mix, sampled once up front and re-used) is timed step by step, and after
each step the tracker logs that step's metrics row the way the job does (`flatten` + `log`), with
the row at its largest: the trainer's figures, per-domain and per-family rewards and pass rates,
the scheduler's figures and its per-domain table (what checkpoint steps add). The overhead is
the median logging time over the median update time. The denominator is the update alone, not
the generation the job's step also waits for, so the share is an upper bound. Prints a table,
then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time
from pathlib import Path


def _groups(policy, prompts, group_size, rng):
    from posttrain.values.generation import GenerationRequest, Message, SamplingParams
    from posttrain.values.trajectory import Trajectory, Turn
    from posttrain.values.verdict import Verdict

    requests = [GenerationRequest((Message("user", p),), SamplingParams(temperature=1.0, max_tokens=8,
                                                                      stop=("\n",), seed=i * 100 + j))
                for i, p in enumerate(prompts) for j in range(group_size)]
    completions = policy.generate(requests)
    groups = []
    for i in range(len(prompts)):
        group = []
        for c in completions[i * group_size:(i + 1) * group_size]:
            reward = float(rng.random() < 0.5)
            turn = Turn(index=0, observation="", action=c.text, prompt_token_ids=c.prompt_token_ids,
                        token_ids=c.token_ids, logprobs=c.logprobs, finish_reason=c.finish_reason)
            group.append(Trajectory(task_key=f"k{i}", task_hash="h", domain="d", split="train",
                                    policy_version="v", status="completed", turns=[turn], reward=reward,
                                    sampling={"temperature": 1.0},
                                    verdict=Verdict(passed=bool(reward), score=reward)))
        groups.append(group)
    return groups


def _row(step, metrics, domains, rng):
    from posttrain.pipeline.main import DOMAIN_SCHED_KEYS

    row = {"step": step, "time": time.time(), **metrics}
    for d in domains:
        row[f"domain/{d}/reward"] = rng.random()
    for fam in ("math", "text"):
        row[f"family/{fam}/reward"] = rng.random()
        row[f"family/{fam}/pass_rate"] = rng.random()
    row.update({f"sched/{k}": rng.random() for k in ("generator_busy", "worker_utilization", "infra_errors",
                                                      "retries", "lost", "queue_wait_p50_s",
                                                      "queue_wait_p99_s", "max_wait_s")})
    row["sched/quarantined"], row["sched/retired"] = [], []
    row["sched/domains"] = {d: {k: rng.random() for k in DOMAIN_SCHED_KEYS} for d in domains}
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="models/tiny-base")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--groups", type=int, default=32)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--backends", default="tensorboard")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()

    import torch

    from posttrain.pipeline.config import DEFAULT_TRAIN
    from posttrain.tasks.registry import get_domain
    from posttrain.tracking import LoggingConfig, flatten, open_tracker
    from posttrain.training.config import TrainerConfig
    from posttrain.training.trainer import Trainer

    torch.set_num_threads(args.threads)
    load = os.getloadavg()[0]
    rng = random.Random(0)
    domains = list(DEFAULT_TRAIN)
    prompts = [get_domain(domains[i % len(domains)]).task(i, "train").prompt for i in range(args.groups)]
    trainer = Trainer(args.model, TrainerConfig(lr=1e-5))
    groups = _groups(trainer.policy(), prompts, args.group_size, rng)
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        tracker = open_tracker(LoggingConfig(backends=backends), Path(tmp), "bench", {"bench": True})
        open_s = time.perf_counter() - t0
        step_s, log_s, n_scalars = [], [], 0
        for step in range(1, args.steps + 1):
            t0 = time.perf_counter()
            metrics = trainer.step(groups)
            step_s.append(time.perf_counter() - t0)
            row = _row(step, metrics, domains, rng)
            t0 = time.perf_counter()
            scalars = flatten(row)
            tracker.log(step, scalars)
            log_s.append(time.perf_counter() - t0)
            n_scalars = len(scalars)
        t0 = time.perf_counter()
        tracker.close()
        close_s = time.perf_counter() - t0
    step_med, log_med = statistics.median(step_s), statistics.median(log_s)
    result = {"backends": backends, "scalars_per_step": n_scalars, "steps": args.steps,
              "update_s_median": round(step_med, 4), "log_ms_median": round(1000 * log_med, 3),
              "log_ms_max": round(1000 * max(log_s), 3), "overhead_pct": round(100 * log_med / step_med, 3),
              "open_s": round(open_s, 3), "close_s": round(close_s, 3), "load": round(load, 2),
              "target_pct": 2.0}
    print(f"{'measure':32} value")
    for key in ("backends", "scalars_per_step", "update_s_median", "log_ms_median", "log_ms_max",
                "overhead_pct", "open_s", "close_s", "load"):
        print(f"{key:32} {result[key]}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
