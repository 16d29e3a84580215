"""Our GRPO step vs TRL's `GRPOTrainer`: same model, tasks, group size, batch and loss, on CPU.

    .venv/bin/pip install -e .[bench]              # trl
    .venv/bin/python benchmarks/vs_trl.py           # 30 steps each, 16 prompts x 8 samples

Both trainers start from the same weights and see the same train-split prompts in the same
order, with the same settings: group-relative advantages scaled by the group std, token-level
loss aggregation ("dapo"), clip 0.2 / 0.28, no KL, one update per batch, AdamW (beta2 0.99, no
weight decay), constant learning rate, gradient clipping at 1, temperature 1, answers stopped at
"\\n" (for TRL: "\\n" made an EOS token), the domains' own verifiers as the reward. A step is
everything: sampling, grading, the loss, the update.

Reported: median seconds per step (the first step, a warm-up, excluded; each trainer run
`--repeats` times, alternating with the other, its fastest run counting), the mean training
reward over the last 5 steps, and sampled pass@1 of the trained weights on the eval split
(measured the same way for both). Torch threads are set explicitly and the load average is
printed: the machine is shared, so compare the two within one run. Prints a table, then one
JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="models/tiny-base")
    parser.add_argument("--domains", default=None, help="comma-separated (default: the main job's mix)")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--prompts", type=int, default=16, help="prompts (groups) per step")
    parser.add_argument("--group", type=int, default=8, help="samples per prompt")
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--eval-tasks", type=int, default=30)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=2, help="alternating runs of each; the fastest counts")
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    from posttrain.evaluation.quick import pass_rates as evaluate
    from posttrain.pipeline.config import DEFAULT_TRAIN
    from posttrain.policies.local import TorchPolicy
    from posttrain.scheduling.engine import WorkItem, run_episodes
    from posttrain.tasks.registry import get_domain
    from posttrain.training.config import TrainerConfig
    from posttrain.training.trainer import Trainer
    from posttrain.values.generation import PolicyVersion, SamplingParams
    from posttrain.verifiers.base import Outcome

    args.domains = args.domains or ",".join(DEFAULT_TRAIN)
    domains = [get_domain(n) for n in args.domains.split(",")]
    by_name = {d.name: d for d in domains}
    n_rows = args.steps * args.prompts
    rows = [(domains[i % len(domains)], 1000 + i) for i in range(n_rows)]
    tasks = [d.task(seed, "train") for d, seed in rows]
    loads: dict[str, tuple[float, float]] = {}

    sampling = SamplingParams(temperature=1.0, max_tokens=args.max_tokens)

    def run_ours() -> tuple[list[float], list[float], TorchPolicy]:
        trainer = Trainer(args.model, TrainerConfig(lr=args.lr, seed=args.seed, micro_batch_size=128))
        times, rewards = [], []
        for step in range(args.steps):
            t0 = time.perf_counter()
            lo = step * args.prompts
            specs = [WorkItem(rows[i][0], tasks[i], group_id=str(i))
                     for i in range(lo, lo + args.prompts) for _ in range(args.group)]
            trajectories = run_episodes(specs, trainer.policy(), sampling, workers=1)
            groups: dict[str, list] = {}
            for t in trajectories:
                groups.setdefault(t.group_id, []).append(t)
            metrics = trainer.step(list(groups.values()))
            times.append(time.perf_counter() - t0)
            rewards.append(metrics["reward_mean"])
        return times, rewards, trainer.policy()

    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    def reward(prompts, completions, domain, seed, **_):
        out = []
        for text, name, s in zip(completions, domain, seed):
            d = by_name[name]
            out.append(d.verifier.verify(d.task(s, "train"), Outcome(answer=text.split("\n")[0])).score)
        return out

    class Timer(TrainerCallback):
        def __init__(self) -> None:
            self.times: list[float] = []
            self.rewards: list[float] = []
            self.t0 = time.perf_counter()

        def on_step_end(self, *a, **k):
            now = time.perf_counter()
            self.times.append(now - self.t0)
            self.t0 = now

        def on_log(self, _args, _state, _control, logs=None, **k):
            if logs and "reward" in logs:
                self.rewards.append(float(logs["reward"]))

    dataset = Dataset.from_list([{"prompt": t.prompt, "domain": d.name, "seed": s}
                                 for (d, s), t in zip(rows, tasks)])

    def run_trl() -> tuple[list[float], list[float], TorchPolicy]:
        tok = AutoTokenizer.from_pretrained(args.model)
        model = AutoModelForCausalLM.from_pretrained(args.model)
        # stop at "\n" like ours: TRL stops (and masks the loss) at EOS ids
        model.generation_config.eos_token_id = [tok.convert_tokens_to_ids("\n"), tok.eos_token_id]
        timer = Timer()
        with tempfile.TemporaryDirectory() as out_dir:
            config = GRPOConfig(
                output_dir=out_dir, max_steps=args.steps, per_device_train_batch_size=args.prompts * args.group,
                num_generations=args.group, gradient_accumulation_steps=1, learning_rate=args.lr,
                lr_scheduler_type="constant", warmup_steps=0, adam_beta2=0.99, weight_decay=0.0,
                max_grad_norm=1.0, beta=0.0, epsilon=0.2, epsilon_high=0.28, loss_type="dapo",
                scale_rewards="group", num_iterations=1, temperature=1.0, top_p=1.0,
                max_completion_length=args.max_tokens, use_cpu=True, bf16=False, logging_steps=1,
                save_strategy="no", report_to="none", shuffle_dataset=False, disable_dropout=True,
                seed=args.seed, dataloader_num_workers=0, disable_tqdm=True, gradient_checkpointing=False)
            trl = GRPOTrainer(model=model, reward_funcs=reward, args=config, train_dataset=dataset,
                              processing_class=tok, callbacks=[timer])
            trl.remove_callback(PrinterCallback)  # its per-step log dicts would bury the table
            timer.t0 = time.perf_counter()
            trl.train()
        policy = TorchPolicy(trl.model.to("cpu").eval(), tok, version=PolicyVersion(name="trl"))
        return timer.times, timer.rewards, policy

    # Alternate the two, `repeats` times (each run from scratch, same seeds, same results), and
    # keep each one's fastest run: load from other jobs then hits both alike.
    runs: dict[str, list] = {"ours": [], "trl": []}
    loads: dict[str, list[float]] = {"ours": [], "trl": []}
    for _ in range(args.repeats):
        for name, fn in (("ours", run_ours), ("trl", run_trl)):
            loads[name].append(os.getloadavg()[0])
            runs[name].append(fn())
    best = {k: min(v, key=lambda r: statistics.median(r[0][1:] or r[0])) for k, v in runs.items()}
    ours_times, ours_rewards, ours_policy = best["ours"]
    trl_times, trl_rewards, trl_policy = best["trl"]

    # -- the same measurement of both ------------------------------------------------------
    def eval_pass1(policy) -> float:
        res = evaluate(policy, domains, n_tasks=args.eval_tasks, n_samples=4, greedy=False,
                       max_tokens=args.max_tokens)
        return sum(r["pass1"] for r in res.values()) / len(res)

    base_pass1 = eval_pass1(TorchPolicy(args.model, device="cpu"))
    ours_pass1, trl_pass1 = eval_pass1(ours_policy), eval_pass1(trl_policy)
    ours_s = statistics.median(ours_times[1:] or ours_times)
    trl_s = statistics.median(trl_times[1:] or trl_times)
    ours_r = statistics.mean(ours_rewards[-5:])
    trl_r = statistics.mean(trl_rewards[-5:]) if trl_rewards else float("nan")

    print(f"model {args.model}; {args.steps} steps of {args.prompts} prompts x {args.group} samples; "
          f"domains {args.domains}; lr {args.lr}; {args.threads} thread(s)")
    print(f"{'trainer':8s} {'s/step':>8s} {'all runs':>16s} {'reward (last 5)':>16s} {'eval pass@1':>12s} "
          f"{'load avg at start':>18s}")
    print(f"{'base':8s} {'':>8s} {'':>16s} {'':>16s} {base_pass1:12.3f}")
    for name, s, r, p in (("ours", ours_s, ours_r, ours_pass1), ("trl", trl_s, trl_r, trl_pass1)):
        every = " ".join(f"{statistics.median(run[0][1:] or run[0]):.3f}" for run in runs[name])
        print(f"{name:8s} {s:8.3f} {every:>16s} {r:16.3f} {p:12.3f} "
              f"{' '.join(f'{x:.2f}' for x in loads[name]):>18s}")
    print(f"speed-up (trl s/step / ours s/step): {trl_s / ours_s:.2f}x")
    print(json.dumps({"ours_s_per_step": round(ours_s, 4), "trl_s_per_step": round(trl_s, 4),
                      "ours_reward": round(ours_r, 4), "trl_reward": round(trl_r, 4),
                      "ours_eval_pass1": round(ours_pass1, 4), "trl_eval_pass1": round(trl_pass1, 4),
                      "base_eval_pass1": round(base_pass1, 4), "speedup": round(trl_s / ours_s, 2),
                      "steps": args.steps, "batch": args.prompts * args.group, "threads": args.threads,
                      "repeats": args.repeats,
                      "load_avg": {k: [round(x, 2) for x in v] for k, v in loads.items()}}))


if __name__ == "__main__":
    main()
