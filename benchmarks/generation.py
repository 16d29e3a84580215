"""TorchPolicy sampling speed: KV cache vs no cache vs `model.generate()`, same model, same run.

    .venv/bin/python benchmarks/generation.py                       # shipped tiny model
    .venv/bin/python benchmarks/generation.py --batch 64 --new-tokens 32 --threads 1

Every variant samples the same prompts (the default mix's train prompts) at temperature 1 for
exactly `--new-tokens` tokens (no stop strings), `--repeats` times, interleaved so that machine
load hits all variants alike; the best and median wall times are reported. Prints a table, then
one JSON line. Compare ratios within one run: the machine is shared and noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="models/tiny-base")
    parser.add_argument("--batch", type=int, default=64, help="prompts per generate call")
    parser.add_argument("--new-tokens", type=int, default=32, help="tokens generated per prompt")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args = parser.parse_args()

    import torch

    from posttrain.pipeline.config import DEFAULT_TRAIN
    from posttrain.policies.local import TorchPolicy
    from posttrain.tasks.registry import get_domain
    from posttrain.values.generation import GenerationRequest, Message, SamplingParams

    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()[0]
    policy = TorchPolicy(args.model, device="cpu")
    policy.eos_ids = set()  # run every row the full length: equal work for all variants
    domains = [get_domain(n) for n in DEFAULT_TRAIN]
    prompts = [domains[i % len(domains)].task(i, "train").prompt for i in range(args.batch)]
    sampling = SamplingParams(temperature=1.0, max_tokens=args.new_tokens)
    requests = [GenerationRequest((Message("user", p),), sampling) for p in prompts]
    prompt_ids = [policy.render(r) for r in requests]

    def ours(cache: bool):
        def run() -> int:
            policy.use_cache = cache
            return sum(len(c.token_ids or []) for c in policy.generate(requests))
        return run

    def hf_generate() -> int:
        width = max(map(len, prompt_ids))
        ids = torch.full((len(prompt_ids), width), policy.pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, p in enumerate(prompt_ids):
            ids[i, width - len(p):], mask[i, width - len(p):] = torch.tensor(p), 1
        with torch.inference_mode():
            out = policy.model.generate(input_ids=ids, attention_mask=mask, do_sample=True,
                                        temperature=1.0, top_p=1.0, top_k=0,
                                        max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens,
                                        pad_token_id=policy.pad_id)
        return int((out.shape[1] - width) * out.shape[0])

    variants = {"ours, KV cache": ours(True), "ours, no cache": ours(False),
                "HF generate(), KV cache": hf_generate}
    times: dict[str, list[float]] = {k: [] for k in variants}
    tokens: dict[str, int] = {}
    for fn in variants.values():
        fn()  # warm-up
    for _ in range(args.repeats):
        for name, fn in variants.items():
            t0 = time.perf_counter()
            tokens[name] = fn()
            times[name].append(time.perf_counter() - t0)

    base = min(times["ours, KV cache"])
    print(f"model {args.model}, batch {args.batch} x {args.new_tokens} new tokens, "
          f"{args.threads} thread(s), load avg {load_before:.2f} -> {os.getloadavg()[0]:.2f}")
    print(f"{'variant':26s} {'best s':>8s} {'median s':>9s} {'tokens/s':>10s} {'vs ours+cache':>14s}")
    for name in variants:
        best = min(times[name])
        print(f"{name:26s} {best:8.3f} {statistics.median(times[name]):9.3f} "
              f"{tokens[name] / best:10,.0f} {best / base:13.2f}x")
    print(json.dumps({
        "batch": args.batch, "new_tokens": args.new_tokens, "threads": args.threads,
        "cache_tokens_per_s": round(tokens["ours, KV cache"] / min(times["ours, KV cache"])),
        "no_cache_tokens_per_s": round(tokens["ours, no cache"] / min(times["ours, no cache"])),
        "hf_generate_tokens_per_s": round(tokens["HF generate(), KV cache"]
                                          / min(times["HF generate(), KV cache"])),
        "cache_speedup": round(min(times["ours, no cache"]) / base, 2),
        "vs_hf_generate": round(min(times["HF generate(), KV cache"]) / base, 2),
        "load_avg": round(load_before, 2)}))


if __name__ == "__main__":
    main()
