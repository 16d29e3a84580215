"""TorchPolicy fast mode vs standard mode, and KV reuse across turns, same model, same run.

    .venv/bin/python benchmarks/fast_mode.py                       # shipped tiny model
    .venv/bin/python benchmarks/fast_mode.py --model models/tiny-agent --prompt-chars 400 --copy-tokens 256
    .venv/bin/python benchmarks/fast_mode.py --episode-model models/tiny-agent  # tool episodes in 5-6
    .venv/bin/python benchmarks/fast_mode.py --identical 300 --repeats 2   # a quicker look

Six measurements, then one JSON line:

1. **speed on copy-heavy transcripts** -- the registry's tool-use and code domains' oracle
   transcripts (`<bash>...</bash>`, `<edit ...>`, code blocks), cut to `--prompt-chars` so
   that the model's 128 positions leave room to generate, continued greedily to the context's
   end by standard and fast mode (prompt lookup; and the distilled draft model when
   `models/tiny-base-draft` exists), `--repeats` times interleaved; best wall time each.
   `acceptance_len` per domain = tokens emitted per row per target forward (1.0 = standard).
2. **speed on the model's own task answers** (no copying to find: short answers, stop "\\n"),
   the case where fast mode must not cost much.
3. **greedy identity** -- `--identical` prompts across every task family (prompts and oracle
   transcripts cut at varied lengths, with and without stop strings): fast output must equal
   standard output token for token (`greedy_mismatches` = 0).
4. **pass@1 on the same eval** -- the RL mix's eval split sampled at temperature 1 by standard
   mode and by fast mode as shipped (prompt lookup + prefix cache): fast must fall inside the
   standard mode's 95% interval (binomial over samples, averaged over domains).
5. **reuse across turns** -- 8-turn token-in/token-out episodes: the share of turn 8's prompt
   served by the prefix cache, and the wall time of whole episodes with reuse vs without.
   `--episode-model DIR` runs these episodes (and section 6's) on another model than sections
   1-4, e.g. `tiny-agent`, whose 1,024 positions hold tool episodes that tiny-base's 128 cannot.
   `--episode-kind tools` (the default for a model of >= 512 positions, e.g. `tiny-agent`):
   tool-use episodes of the agentic domains -- the environment's real first observation (task,
   workspace, tool list), each turn a tool call stopped at its closing tag, then an observation
   in the sandbox's format (`[bash] exit 0` + the oracle's next call as output: synthesised, no
   sandbox is run). `math`: each turn "\\n" + a new one-digit problem.
6. **the server** (`posttrain.policies.serve`'s engine over loopback, same model object):
   the copy-heavy transcripts through `--mode fast` vs `--mode standard` at `--batch`
   concurrent requests (tokens per second, acceptance, greedy identity between the two), and
   the tool episodes through it with its radix prefix cache vs without (reused share, speedup).

Compare ratios within one run: the machine is shared and noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from pathlib import Path

COPY_DOMAINS = ("code.str.reverse", "code.str.rle", "code.list.window", "code.repair.str.rle",
                "code.repair.list.kth", "terminal.text.uppercase", "terminal.files.concat",
                "terminal.git.tag", "terminal.config.set-key", "terminal.text.replace")
OWN_DOMAINS = ("text.reverse.l3", "text.upper.l5", "text.double.l3", "math.add.d1", "math.max.d1")
EPISODE_DOMAINS = ("math.add.d1", "math.sub.d1", "math.mul.d1")
TOOL_DOMAINS = ("terminal.count.words", "terminal.count.level-lines", "terminal.find.largest",
                "code.repair.list.kth", "code.repair.str.rle", "code.repair.list.window")


def episode_script(kind: str, n: int):
    """(first prompts, per episode the 7 observations that follow turns 1..7, sampling)."""
    from posttrain.envs import initial_observation, stop_strings
    from posttrain.tasks.registry import get_domain
    from posttrain.values.generation import SamplingParams

    if kind == "math":
        problems = [[get_domain(EPISODE_DOMAINS[(e + t) % 3]).task(1000 * e + t, "train").prompt for t in range(8)]
                    for e in range(n)]
        return ([p[0] for p in problems], [["\n" + q for q in p[1:]] for p in problems],
                SamplingParams(temperature=0.0, max_tokens=6, stop=("\n",)))
    firsts, observations = [], []
    for e in range(n):
        domain = get_domain(TOOL_DOMAINS[e % len(TOOL_DOMAINS)])
        task = domain.task(e, "train")
        firsts.append(initial_observation(domain, task) + "\n")
        calls = [str(a) for a in domain.oracle(task)]
        # what a sandbox shows after a call: its status line and output (here the oracle's next
        # call, cut: an observation that quotes code the episode has seen)
        observations.append([f"\n[bash] exit 0\n{calls[(t + 1) % len(calls)][:80]}\n" for t in range(7)])
    return firsts, observations, SamplingParams(temperature=0.0, max_tokens=24, stop=stop_strings(domain))


def transcript(domain, seed: int) -> str:
    task = domain.task(seed, "train")
    return "\n".join(str(a) for a in domain.oracle(task))


def family_prompts(n: int, seed: int) -> list[tuple[str, str, int, tuple[str, ...]]]:
    """(family, text, max_tokens, stop) for n prompts spread over every registry family."""
    from posttrain.tasks.registry import all_domains, get_domain

    rng = random.Random(seed)
    by_family: dict[str, list[str]] = {}
    for name in sorted(all_domains()):
        by_family.setdefault(name.split(".")[0], []).append(name)
    per_family = -(-n // len(by_family))
    out = []
    for family, names in sorted(by_family.items()):
        rng.shuffle(names)
        got, s = 0, 0
        while got < per_family and s < 20 * per_family:
            name = names[s % len(names)]
            s += 1
            try:
                domain = get_domain(name)
                task = domain.task(s, "train")
                text = task.prompt if s % 2 else "\n".join(str(a) for a in domain.oracle(task))
            except Exception:  # a domain without train tasks (an imported one): the next one
                continue
            cut = rng.randint(6, 90)
            out.append((family, text[:cut], rng.choice((16, 32, 48)), rng.choice(((), ("\n",), ("=",)))))
            got += 1
    return out[:n]


def measure_server(standard, episode_base, copy_requests, firsts, observations, greedy,
                   args) -> tuple[list[str], dict]:
    """Section 6: (table lines, JSON fields). Servers share `standard`'s model object (the tool
    episodes: `episode_base`'s) and run one at a time (an idle engine waits without spinning)."""
    import urllib.request
    from concurrent.futures import ThreadPoolExecutor

    from posttrain.policies.local import TorchPolicy
    from posttrain.policies.openai_compat import OpenAIConfig, OpenAIPolicy
    from posttrain.policies.serve import PolicyServer

    def server(mode: str, cache_mb: float, base=standard) -> PolicyServer:
        return PolicyServer(TorchPolicy(base.model, base.tokenizer), model_name="m", mode=mode,
                            prefix_cache_mb=cache_mb).start()

    # copy-heavy transcripts: no prefix cache, so a repeat does not find its prompt computed
    servers = {"standard": server("standard", 0), "fast": server("fast", 0)}
    best: dict[str, float] = {}
    outs: dict[str, list] = {}
    accept: dict[str, float] = {}
    try:
        for _ in range(args.repeats):
            for name, srv in servers.items():
                remote = OpenAIPolicy(OpenAIConfig(base_url=srv.url, model="m", max_retries=0,
                                                   max_concurrency=args.batch, timeout_s=1800))
                stats = srv.engine.stats
                tokens0, rows0 = stats.tokens, stats.row_steps
                secs, _, out = timed(lambda remote=remote: remote.generate(copy_requests))
                best[name] = min(best.get(name, 1e9), secs)
                outs[name] = out  # type: ignore[assignment]
                accept[name] = (stats.tokens - tokens0) / max(1, stats.row_steps - rows0)
    finally:
        for srv in servers.values():
            srv.close()
    tokens = {n: sum(len(c.token_ids or []) for c in o) for n, o in outs.items()}
    speed = {n: max(1, tokens[n]) / best[n] for n in outs}
    mismatches = sum((a.token_ids, a.text) != (b.token_ids, b.text) for a, b in zip(outs["standard"], outs["fast"]))

    # tool episodes, token in / token out, every episode on its own connection
    tok = episode_base.tokenizer

    def episode(url: str, e: int) -> list[dict]:
        prompt = [tok.bos_token_id] + tok(firsts[e], add_special_tokens=False)["input_ids"]
        usages = []
        for t in range(8):
            body = {"model": "m", "prompt": prompt, "max_tokens": greedy.max_tokens, "temperature": 0,
                    "stop": list(greedy.stop), "return_token_ids": True}
            request = urllib.request.Request(f"{url}/completions", data=json.dumps(body).encode(),
                                             headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=1800) as r:
                answer = json.loads(r.read())
            choice = answer["choices"][0]
            usages.append(dict(answer["usage"], token_ids=choice["token_ids"]))
            if t < 7:
                prompt = prompt + choice["token_ids"] + tok(observations[e][t], add_special_tokens=False)["input_ids"]
        return usages

    ep_best: dict[str, float] = {}
    ep_out: dict[str, list] = {}
    for _ in range(args.repeats):
        for name, mode, mb in (("without reuse", "standard", 0), ("with reuse", "standard", 64),
                               ("fast + reuse", "fast", 64)):
            srv = server(mode, mb, episode_base)
            try:
                with ThreadPoolExecutor(len(firsts)) as pool:
                    secs, _, got = timed(lambda srv=srv, pool=pool: list(pool.map(
                        lambda e, url=srv.url: episode(url, e), range(len(firsts)))))
            finally:
                srv.close()
            ep_best[name] = min(ep_best.get(name, 1e9), secs)
            ep_out[name] = got  # type: ignore[assignment]
    last = [e[7] for e in ep_out["with reuse"]]
    share = sum(u["reused_tokens"] for u in last) / sum(u["prompt_tokens"] for u in last)
    same = all([u["token_ids"] for u in ep_out["without reuse"][e]] == [u["token_ids"] for u in ep_out[n][e]]
               for e in range(len(firsts)) for n in ("with reuse", "fast + reuse"))
    lines = [f"\nserver (continuous batch, {args.batch} concurrent requests, copy-heavy): standard "
             f"{speed['standard']:,.0f} tok/s, fast {speed['fast']:,.0f} tok/s "
             f"({speed['fast'] / speed['standard']:.2f}x), tokens per row-step {accept['fast']:.2f}; greedy "
             f"fast vs standard: {len(copy_requests)} prompts, {mismatches} mismatches",
             f"server 8-turn episodes x {len(firsts)} (concurrent): reused share at turn 8 {share:.3f}; "
             f"outputs identical with reuse: {same}"]
    lines += [f"  {n:14s} {t:7.3f} s  {ep_best['without reuse'] / t:5.2f}x" for n, t in ep_best.items()]
    return lines, {
        "server_speedup_tokens_per_s": round(speed["fast"] / speed["standard"], 2),
        "server_standard_tokens_per_s": round(speed["standard"]), "server_fast_tokens_per_s": round(speed["fast"]),
        "server_acceptance_len": round(accept["fast"], 2),
        "server_greedy_identical": len(copy_requests), "server_greedy_mismatches": mismatches,
        "server_prefill_reused_share": round(share, 3), "server_reuse_outputs_identical": same,
        "server_episode_speedup": round(ep_best["without reuse"] / ep_best["with reuse"], 2),
        "server_episode_speedup_fast": round(ep_best["without reuse"] / ep_best["fast + reuse"], 2),
    }


def timed(fn) -> tuple[float, float, object]:
    """(wall seconds, CPU seconds of this process, result)"""
    t0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return time.perf_counter() - t0, time.process_time() - c0, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="models/tiny-base")
    parser.add_argument("--draft", default=None,
                        help="draft model directory (default: MODEL-draft when it exists; '' to skip)")
    parser.add_argument("--prompt-chars", type=int, default=48)
    parser.add_argument("--copy-tokens", type=int, default=128, help="tokens generated per copy-heavy transcript")
    parser.add_argument("--episode-model", default=None,
                        help="the model of the 8-turn episodes (sections 5 and 6; default: --model): e.g. "
                             "models/tiny-agent, whose 1,024 positions hold tool episodes")
    parser.add_argument("--episode-kind", choices=("tools", "math"), default=None,
                        help="8-turn episodes (default: tools for a model of >= 512 positions, else math)")
    parser.add_argument("--server", type=int, default=1, help="1: also measure the server (section 6)")
    parser.add_argument("--per-domain", type=int, default=8, help="transcripts per copy domain")
    parser.add_argument("--identical", type=int, default=1200, help="prompts in the greedy identity check")
    parser.add_argument("--batch", type=int, default=16, help="rows per generate call (copy-heavy workload)")
    parser.add_argument("--batches", default="1,80", help="other batch sizes reported for the copy-heavy workload")
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument("--pass1-tasks", type=int, default=30, help="eval tasks per domain for pass@1 (0 to skip)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()

    import torch

    from posttrain.policies.local import TorchPolicy
    from posttrain.tasks.registry import get_domain
    from posttrain.values.generation import GenerationRequest, Message, SamplingParams

    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()[0]
    standard = TorchPolicy(args.model, device="cpu")
    fast = TorchPolicy(standard.model, standard.tokenizer, mode="fast", prefix_cache_mb=0)
    variants = {"standard": standard, "fast (prompt lookup)": fast}
    if args.draft is None:
        args.draft = args.model.rstrip("/") + "-draft"
    if args.draft and Path(args.draft).is_dir():
        variants["fast (draft model)"] = TorchPolicy(standard.model, standard.tokenizer, mode="fast",
                                                     draft=args.draft, max_draft=4, prefix_cache_mb=0)
    req = lambda text, **s: GenerationRequest((Message("user", text),), SamplingParams(**s))  # noqa: E731

    def speed(requests, batch: int) -> tuple[dict[str, float], dict[str, float]]:
        """tokens per wall second and per CPU second, per variant (best of repeats, interleaved;
        `batch` rows per generate call)."""
        best: dict[str, float] = {}
        best_cpu: dict[str, float] = {}
        tokens: dict[str, int] = {}

        def run(policy):
            return [c for lo in range(0, len(requests), batch) for c in policy.generate(requests[lo:lo + batch])]
        for policy in variants.values():
            policy.generate(requests[:4])  # warm-up
        for _ in range(args.repeats):
            for name, policy in variants.items():
                s, cpu, out = timed(lambda policy=policy: run(policy))
                best[name] = min(best.get(name, 1e9), s)
                best_cpu[name] = min(best_cpu.get(name, 1e9), cpu)
                tokens[name] = sum(len(c.token_ids or []) for c in out)  # type: ignore[union-attr]
        return ({name: tokens[name] / best[name] for name in variants},
                {name: tokens[name] / best_cpu[name] for name in variants})

    # 1. copy-heavy transcripts
    copy_requests, acceptance = [], {}
    for name in COPY_DOMAINS:
        domain = get_domain(name)
        # cut at most half way: a whole transcript leaves nothing to continue (the model ends it)
        whole = [transcript(domain, s) for s in range(args.per_domain)]
        texts = [t[:min(args.prompt_chars, len(t) // 2)] for t in whole]
        reqs = [req(t, temperature=0.0, max_tokens=args.copy_tokens) for t in texts]
        copy_requests += reqs
        for vname, policy in variants.items():
            if policy.mode == "fast":
                before = dict(policy.spec_stats.as_dict())
                policy.generate(reqs)
                after = policy.spec_stats
                steps = after.row_steps - before["row_steps"]
                acceptance.setdefault(vname, {})[name] = round((after.emitted - before["emitted"]) / max(1, steps), 2)
    copy_speed, copy_cpu = speed(copy_requests, args.batch)
    sweep = {b: speed(copy_requests, b) for b in (int(x) for x in args.batches.split(",") if x)}
    own_requests = [req(get_domain(d).task(s, "train").prompt, temperature=0.0, max_tokens=16, stop=("\n",))
                    for d in OWN_DOMAINS for s in range(40)]
    own_speed, own_cpu = speed(own_requests, args.batch)

    # 3. greedy identity across families
    prompts = family_prompts(args.identical, seed=0)
    requests = [req(t, temperature=0.0, max_tokens=m, stop=st) for _, t, m, st in prompts]
    identity: dict[str, tuple[int, int]] = {}
    reference = standard.generate(requests)
    for vname, policy in variants.items():
        if policy is standard:
            continue
        out = policy.generate(requests)
        bad = sum((a.token_ids, a.text, a.finish_reason) != (b.token_ids, b.text, b.finish_reason)
                  for a, b in zip(reference, out))
        identity[vname] = (len(requests), bad)
    families = sorted({f for f, *_ in prompts})

    # 4. pass@1, standard vs fast as shipped
    pass1: dict[str, float] = {}
    if args.pass1_tasks:
        from posttrain.evaluation.quick import pass_rates
        from posttrain.pipeline.config import DEFAULT_TRAIN

        mix = [get_domain(n) for n in DEFAULT_TRAIN]
        shipped = TorchPolicy(standard.model, standard.tokenizer, mode="fast")
        for name, policy in (("standard", standard), ("fast", shipped)):
            res = pass_rates(policy, mix, n_tasks=args.pass1_tasks, n_samples=8, greedy=False)
            pass1[name] = sum(r["pass1"] for r in res.values()) / len(res)
            if name == "standard":
                n = args.pass1_tasks * 8
                half = 1.96 * sum(r["pass1"] * (1 - r["pass1"]) / n for r in res.values()) ** 0.5 / len(res)

    # 5. reuse across turns, token in / token out
    episode_base = (TorchPolicy(args.episode_model, device="cpu")
                    if args.episode_model and args.episode_model != args.model else standard)
    tok = episode_base.tokenizer
    ids = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    reuse = TorchPolicy(episode_base.model, tok, prefix_cache_mb=64)
    fast_reuse = TorchPolicy(episode_base.model, tok, mode="fast", prefix_cache_mb=64)
    kind = args.episode_kind or ("tools" if (episode_base.max_positions or 0) >= 512 else "math")
    firsts, observations, greedy = episode_script(kind, args.episodes)

    def episodes(policy):
        prompts_ = [[tok.bos_token_id] + ids(f) for f in firsts]
        turns = []
        for t in range(8):
            out = policy.generate_ids(prompts_, [greedy] * len(prompts_))
            turns.append(out)
            if t < 7:
                prompts_ = [p + c.token_ids + ids(observations[e][t]) for e, (p, c) in enumerate(zip(prompts_, out))]
        return turns

    ep_times: dict[str, float] = {}
    ep_out = {}
    for _ in range(args.repeats):
        for name, policy in (("without reuse", episode_base), ("with reuse", reuse), ("fast + reuse", fast_reuse)):
            if policy.prefix_cache is not None:
                policy.prefix_cache.clear()
            s, _, out = timed(lambda policy=policy: episodes(policy))
            ep_times[name] = min(ep_times.get(name, 1e9), s)
            ep_out[name] = out
    last = ep_out["with reuse"][-1]
    share = sum(c.reused_tokens for c in last) / sum(len(c.prompt_token_ids) for c in last)
    same = all([c.token_ids for c in ep_out["without reuse"][t]] == [c.token_ids for c in ep_out[name][t]]
               for t in range(8) for name in ("with reuse", "fast + reuse"))
    turn8_len = sum(len(c.prompt_token_ids) for c in last) / len(last)

    server_lines: list[str] = []
    server_result: dict = {}
    if args.server:
        server_lines, server_result = measure_server(standard, episode_base, copy_requests, firsts,
                                                     observations, greedy, args)

    print(f"model {args.model}, {args.threads} thread(s), load avg {load_before:.2f} -> {os.getloadavg()[0]:.2f}")
    print(f"{'workload':34s} " + " ".join(f"{n:>22s}" for n in variants))
    rows = [(f"copy-heavy, batch {args.batch}", copy_speed), ("  same, per CPU second", copy_cpu)]
    for b, (sp, cp) in sweep.items():
        rows += [(f"copy-heavy, batch {b}", sp), ("  same, per CPU second", cp)]
    rows += [(f"own task answers, batch {args.batch}", own_speed), ("  same, per CPU second", own_cpu)]
    print(f"({len(copy_requests)} copy-heavy transcripts, {len(own_requests)} task prompts)")
    for label, sp in rows:
        print(f"{label:34s} " + " ".join(f"{sp[n]:12,.0f} tok/s {sp[n] / sp['standard']:5.2f}x" for n in variants))
    print(f"\n{'copy domain':28s} " + " ".join(f"{n:>22s}" for n in acceptance))
    for d in COPY_DOMAINS:
        print(f"{d:28s} " + " ".join(f"{acceptance[n][d]:22.2f}" for n in acceptance))
    for vname, (n, bad) in identity.items():
        print(f"\ngreedy identity, {vname}: {n} prompts over {len(families)} families ({', '.join(families)}): "
              f"{bad} mismatches")
    print(f"\n8-turn {kind} episodes x {args.episodes} (turn-8 prompt {turn8_len:.0f} tokens): reused share at turn 8 "
          f"{share:.3f}; outputs identical with reuse: {same}")
    for name, s in ep_times.items():
        print(f"  {name:14s} {s:7.3f} s  {ep_times['without reuse'] / s:5.2f}x")
    for line in server_lines:
        print(line)
    if pass1:
        print(f"\npass@1 (RL mix, eval split, {args.pass1_tasks} tasks x 8 samples per domain): standard "
              f"{pass1['standard']:.3f} +- {half:.3f}, fast {pass1['fast']:.3f}")
    fast_name = "fast (prompt lookup)"
    result = {
        "speedup_tokens_per_s": round(copy_speed[fast_name] / copy_speed["standard"], 2),
        "standard_tokens_per_s": round(copy_speed["standard"]),
        "fast_tokens_per_s": round(copy_speed[fast_name]),
        "speedup_cpu": round(copy_cpu[fast_name] / copy_cpu["standard"], 2),
        "batch": args.batch,
        "speedup_by_batch": {b: round(sp[fast_name] / sp["standard"], 2) for b, (sp, _) in sweep.items()},
        "own_answers_speedup": round(own_speed[fast_name] / own_speed["standard"], 2),
        "acceptance_len": acceptance[fast_name],
        "greedy_identical": identity[fast_name][0],
        "greedy_mismatches": identity[fast_name][1],
        "greedy_families": len(families),
        "prefill_reused_share": round(share, 3),
        "turn8_prompt_tokens": round(turn8_len, 1),
        "reuse_outputs_identical": same,
        "episode_speedup": round(ep_times["without reuse"] / ep_times["with reuse"], 2),
        "episode_speedup_fast": round(ep_times["without reuse"] / ep_times["fast + reuse"], 2),
        "episode_kind": kind, "model": args.model, "episode_model": args.episode_model or args.model,
        "threads": args.threads, "load_avg": round(load_before, 2),
    }
    result.update(server_result)
    if pass1:
        result.update(pass1_standard=round(pass1["standard"], 4), pass1_fast=round(pass1["fast"], 4),
                      pass1_ci95=round(half, 4),
                      pass1_fast_within_ci=abs(pass1["fast"] - pass1["standard"]) <= half)
    if "fast (draft model)" in variants:
        result["draft_speedup_tokens_per_s"] = round(copy_speed["fast (draft model)"] / copy_speed["standard"], 2)
        result["draft_own_answers_speedup"] = round(own_speed["fast (draft model)"] / own_speed["standard"], 2)
        result["draft_acceptance_len"] = acceptance["fast (draft model)"]
        result["draft_greedy_mismatches"] = identity["fast (draft model)"][1]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
