"""Distil the draft model for fast mode (`models/tiny-base-draft`) from `models/tiny-base`, on CPU.

    .venv/bin/python models/distill_draft.py                 # the shipped draft (seeded)
    .venv/bin/python models/distill_draft.py --steps 50 --out /tmp/draft   # a quick try

A draft model only proposes tokens; the target (`tiny-base`) accepts or replaces each of them
(`posttrain.policies.speculative`), so the draft is judged by how often it agrees with the
target, not by task accuracy. It is therefore trained on the target's own behaviour:

* **sequences**: prompts of the target's pretraining corpus domains (train split, through the
  registry, as `models/pretrain.py` does) continued by the target itself, sampled at
  temperature 1 for `continue_tokens` tokens without stopping -- so the draft also learns what
  the target does after an answer, where an episode keeps generating;
* **loss**: the KL divergence from the target's next-token distribution to the draft's, at
  every position of the target's continuation (soft labels carry more than sampled tokens);
* **model**: a GPT-2 with one block of width 64 (same tokenizer, same 128 positions).

The target is frozen; its continuations and distributions are computed on the fly, batch by
batch, never stored.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


@dataclass
class DistillConfig:
    target: str = str(HERE / "tiny-base")
    """the model the draft imitates"""
    out: str = str(HERE / "tiny-base-draft")
    """where the draft, its tokenizer, policy_version.json and distill.json are written"""
    steps: int = 300
    """optimizer steps"""
    batch_size: int = 64
    """sequences per step"""
    continue_tokens: int = 32
    """tokens the target samples after each prompt"""
    lr: float = 3e-3
    """AdamW learning rate (constant after 20 warm-up steps)"""
    n_embd: int = 64
    n_layer: int = 1
    n_head: int = 2
    seed: int = 0
    threads: int = 1
    """torch CPU threads (part of the seed: it sets the order of float reductions)"""

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "continue_tokens", "n_embd", "n_layer", "n_head", "threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"DistillConfig.{name} must be >= 1, got {getattr(self, name)}")


def main(cfg: DistillConfig) -> dict:
    from transformers import GPT2Config, GPT2LMHeadModel

    from posttrain.policies.local import TorchPolicy
    from posttrain.tasks.registry import get_domain
    from posttrain.values.generation import GenerationRequest, Message, SamplingParams

    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    target = TorchPolicy(cfg.target, device="cpu")
    tok, teacher = target.tokenizer, target.model.eval()
    corpus = json.loads((Path(cfg.target) / "pretrain.json").read_text())["config"]["domains"]
    domains = [get_domain(n.strip()) for n in corpus.split(",") if n.strip()]

    config = GPT2Config(vocab_size=teacher.config.vocab_size, n_positions=teacher.config.n_positions,
                        n_embd=cfg.n_embd, n_layer=cfg.n_layer, n_head=cfg.n_head,
                        activation_function="gelu", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                        pad_token_id=tok.pad_token_id)
    draft = GPT2LMHeadModel(config)
    opt = torch.optim.AdamW(draft.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
    n_params = sum(p.numel() for p in draft.parameters())
    print(f"draft: GPT-2 {cfg.n_layer}x{cfg.n_embd}, {n_params / 1e6:.3f}M parameters; "
          f"teacher {cfg.target}; {len(domains)} corpus domains")

    t0, log = time.perf_counter(), []
    for step in range(cfg.steps):
        prompts = []
        for _ in range(cfg.batch_size):
            d = rng.choice(domains)
            task = d.task(rng.randrange(2**31), "train")
            prompts.append(target.render(GenerationRequest((Message("user", task.prompt),))))
        sampling = [SamplingParams(temperature=1.0, max_tokens=cfg.continue_tokens, seed=rng.randrange(2**31))
                    for _ in prompts]
        completions = target.generate_ids(prompts, sampling)
        seqs = [c.prompt_token_ids + c.token_ids for c in completions]
        width = max(map(len, seqs))
        ids = torch.full((len(seqs), width), tok.pad_token_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        weight = torch.zeros_like(ids, dtype=torch.float32)  # the positions that predict a continuation
        for i, (seq, c) in enumerate(zip(seqs, completions)):
            ids[i, :len(seq)] = torch.tensor(seq)
            mask[i, :len(seq)] = 1
            weight[i, len(c.prompt_token_ids) - 1:len(seq) - 1] = 1.0
        with torch.no_grad():
            teacher_logp = torch.log_softmax(teacher(input_ids=ids, attention_mask=mask).logits.float(), -1)
        for group in opt.param_groups:
            group["lr"] = cfg.lr * min(1.0, (step + 1) / 20)
        student_logp = torch.log_softmax(draft(input_ids=ids, attention_mask=mask).logits.float(), -1)
        kl = (teacher_logp.exp() * (teacher_logp - student_logp)).sum(-1)
        loss = (kl * weight).sum() / weight.sum()
        agree = ((teacher_logp.argmax(-1) == student_logp.argmax(-1)).float() * weight).sum() / weight.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        opt.step()
        if step % 50 == 0 or step == cfg.steps - 1:
            el = time.perf_counter() - t0
            log.append({"step": step, "kl": round(loss.item(), 4), "argmax_agreement": round(agree.item(), 4)})
            print(f"step {step:4d}  KL {loss.item():.4f}  argmax agreement {agree.item():.3f}  {el:.0f}s", flush=True)

    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    draft.eval().save_pretrained(out)
    tok.save_pretrained(out)
    (out / "policy_version.json").write_text(json.dumps({"name": "tiny-base-draft", "parent": None}) + "\n")
    report = {"config": dataclasses.asdict(cfg), "params": n_params,
              "train_s": round(time.perf_counter() - t0, 1), "log": log}
    report["config"]["target"] = Path(cfg.target).name
    report["config"]["out"] = Path(cfg.out).name
    (out / "distill.json").write_text(json.dumps(report, indent=1) + "\n")
    return report


def parse_args() -> DistillConfig:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for f in dataclasses.fields(DistillConfig):
        parser.add_argument(f"--{f.name.replace('_', '-')}", type=type(f.default), default=f.default,
                            help=f"default: {f.default}")
    return DistillConfig(**vars(parser.parse_args()))


if __name__ == "__main__":
    main(parse_args())
