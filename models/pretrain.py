"""Pretrain the shipped tiny base model (`models/tiny-base`) from scratch, on CPU, in minutes.

    .venv/bin/python models/pretrain.py                      # the shipped model (seeded)
    .venv/bin/python models/pretrain.py --steps 200 --out /tmp/tiny   # a quick try

Read top to bottom: settings, the character tokenizer, the corpus, the model, the loop, the save,
a short evaluation. The corpus is described in `models/README.md`; in short:

* prompts come from the task registry (`posttrain.tasks.registry`), **train split only** -- the
  eval split is disjoint by content and stays unseen;
* one problem per row, `<bos>` + prompt + answer + "\\n", loss on the answer and the "\\n" only;
* a share `slip_rate` (30%) of the answers carries a *systematic* slip: the same careless
  habit in every domain, the last letter or digit nudged by one ("85" -> "86", "dcba" -> "dcbb").
  The model learns the right procedure and the habit side by side, so it samples the right
  answer often but not reliably: pass@8 well above pass@1. That gap is the latent capability RL
  turns into pass@1; because the habit is shared, removing it on some domains carries over to
  others. (`--slip domain` uses each op's own typical error instead -- a forgotten carry, only
  the first letter upper-cased -- which RL must unlearn domain by domain; see models/README.md.)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from posttrain.tasks.families.common import perturb

# The domains of the corpus: the default RL mix (`posttrain.pipeline.config.DEFAULT_TRAIN`) plus
# the held-out ones the main job checks for forgetting (`DEFAULT_HELDOUT`).
CORPUS_DOMAINS = (
    "text.reverse.l3,text.reverse.l5,text.upper.l3,text.upper.l5,text.lower.l3,text.lower.l5,"
    "text.swapcase.l3,text.swapcase.l5,text.double.l3,text.sort.l3,text.first.l5,text.last.l5,"
    "text.vowels.l5,math.add.d1,math.max.d1,math.min.d1,math.max.d2,math.min.d2"
)

# With --slip domain: the systematic slip of each op, as the key of one of the domain's named
# negatives. A domain whose op is not listed slips with its 'wrong' negative.
SLIPS = {
    "math.add": "no_carry", "math.sub": "no_borrow", "math.max": "first", "math.min": "first",
    "math.mul": "wrong", "text.reverse": "wrong", "text.sort": "wrong", "text.upper": "first_only",
    "text.lower": "first_only", "text.caesar": "wrong", "text.rotate": "rotate_right",
    "text.double": "wrong", "text.first": "wrong", "text.last": "wrong", "text.swapcase": "upper",
}

SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>")
CHARS = tuple(chr(i) for i in range(32, 127)) + ("\n",)


@dataclass
class PretrainConfig:
    out: str = "models/tiny-base"
    """where the model, tokenizer, policy_version.json and pretrain.json are written"""
    domains: str = CORPUS_DOMAINS
    """comma-separated registry domains of the corpus (train split only)"""
    slip_rate: float = 0.3
    """share of answers replaced by a systematic slip (0 = a clean corpus)"""
    slip: str = "generic"
    """'generic': the same careless habit everywhere (the last letter or digit nudged by one);
    'domain': each op's own typical error (a forgotten carry, ...; see SLIPS)"""
    steps: int = 1000
    """optimizer steps"""
    batch_size: int = 128
    """rows (problems) per step"""
    lr: float = 2e-3
    """peak AdamW learning rate (linear warm-up, cosine decay to 10%)"""
    warmup_steps: int = 100
    """linear warm-up steps"""
    weight_decay: float = 0.01
    """AdamW weight decay (matrices only)"""
    grad_clip: float = 1.0
    """max global gradient norm"""
    n_embd: int = 128
    """model width"""
    n_layer: int = 4
    """transformer blocks"""
    n_head: int = 4
    """attention heads"""
    n_positions: int = 128
    """context length in characters"""
    seed: int = 0
    """seeds the corpus, the initialisation and the batch order"""
    threads: int = 2
    """torch CPU threads"""
    eval_tasks: int = 50
    """eval-split tasks per domain for the closing report (0 to skip)"""
    eval_samples: int = 8
    """samples per eval task (pass@1 is their mean, pass@k with k = this)"""

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "n_embd", "n_layer", "n_head", "n_positions", "threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"PretrainConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.slip not in ("generic", "domain"):
            raise ValueError(f"PretrainConfig.slip must be 'generic' or 'domain', got {self.slip!r}")
        if not 0 <= self.slip_rate < 1:
            raise ValueError(f"PretrainConfig.slip_rate must be in [0, 1), got {self.slip_rate}")
        if self.n_embd % self.n_head:
            raise ValueError(f"PretrainConfig.n_embd ({self.n_embd}) must be a multiple of "
                             f"n_head ({self.n_head})")


def build_tokenizer():
    """A character-level `PreTrainedTokenizerFast`: printable ASCII + "\\n", `<bos>` prepended."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(SPECIALS + CHARS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # one per char
    tok.decoder = decoders.Fuse()  # join characters back without spaces
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", special_tokens=[("<bos>", vocab["<bos>"])])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>",
                                   pad_token="<pad>", unk_token="<unk>")


def slip_key(domain_name: str) -> str:
    return SLIPS.get(".".join(domain_name.split(".")[:2]), "wrong")


def check_slips(domains) -> None:
    """Fail loudly if a domain no longer offers its slip (a renamed negative would silently
    turn the corpus clean)."""
    for d in domains:
        key = slip_key(d.name)
        if not any(key in d.negatives(d.task(s, "train")) for s in range(50)):
            raise ValueError(f"domain {d.name}: no negative named {key!r} in 50 tasks "
                             f"(its negatives: {sorted(d.negatives(d.task(0, 'train')))}); update SLIPS")


def make_row(domain, seed: int, slip: bool, kind: str = "domain") -> tuple[str, str]:
    """(prompt, answer) of one train-split task; the answer slips when asked and it can."""
    task = domain.task(seed, "train")
    answer = domain.oracle(task)[0]
    if slip and kind == "generic":
        answer = perturb(answer)
    elif slip:
        # A slip that coincides with the answer (max of three when the first is largest) is no
        # slip for this row; the domain drops it from its negatives, so the answer stays.
        answer = domain.negatives(task).get(slip_key(domain.name), [answer])[0]
    return task.prompt, answer


def make_batch(rows: list[tuple[str, str]], tok, device: str) -> tuple[torch.Tensor, ...]:
    """Right-padded ids, attention mask and labels (-100 everywhere but answer + "\\n")."""
    seqs, labels = [], []
    for prompt, answer in rows:
        p = tok(prompt)["input_ids"]
        a = tok(answer + "\n", add_special_tokens=False)["input_ids"]
        seqs.append(p + a)
        labels.append([-100] * len(p) + a)
    width = max(map(len, seqs))
    ids = torch.full((len(rows), width), tok.pad_token_id, dtype=torch.long)
    lab = torch.full((len(rows), width), -100, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (s, lb) in enumerate(zip(seqs, labels)):
        ids[i, :len(s)], lab[i, :len(s)], mask[i, :len(s)] = torch.tensor(s), torch.tensor(lb), 1
    return ids.to(device), mask.to(device), lab.to(device)


def new_model(tok, cfg):
    """A fresh GPT-2 of `cfg`'s shape (`n_positions`, `n_embd`, `n_layer`, `n_head`) for `tok`.
    Dropout off and exact GELU: GPT-2's defaults (dropout 0.1, gelu_new) made training ~2x
    slower on CPU for nothing (measured at 2M parameters; models/README.md)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=len(tok), n_positions=cfg.n_positions, n_embd=cfg.n_embd,
                        n_layer=cfg.n_layer, n_head=cfg.n_head, activation_function="gelu",
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                        pad_token_id=tok.pad_token_id)
    return GPT2LMHeadModel(config)


def new_optimizer(model, cfg) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (`cfg.lr`, `cfg.weight_decay`)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.95))


def lr_at(cfg, step: int) -> float:
    """Linear warm-up over `cfg.warmup_steps`, then cosine to 10% of `cfg.lr` at `cfg.steps`."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    t = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


def train_step(model, opt, cfg, step: int, ids, mask, labels) -> torch.Tensor:
    """One clipped AdamW update at step `step`'s learning rate; returns the loss."""
    for group in opt.param_groups:
        group["lr"] = lr_at(cfg, step)
    loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
    opt.step()
    return loss


def main(cfg: PretrainConfig) -> dict:

    from posttrain.tasks.registry import get_domain

    torch.set_num_threads(cfg.threads)
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    domains = [get_domain(n.strip()) for n in cfg.domains.split(",") if n.strip()]
    if cfg.slip == "domain":
        check_slips(domains)
    tok = build_tokenizer()

    model = new_model(tok, cfg)
    n_params = sum(p.numel() for p in model.parameters())
    opt = new_optimizer(model, cfg)

    print(f"model: GPT-2 {cfg.n_layer}x{cfg.n_embd}, {n_params / 1e6:.2f}M parameters; "
          f"corpus: {len(domains)} domains, slip rate {cfg.slip_rate}")
    t0, cpu0, seen = time.perf_counter(), time.process_time(), 0
    model.train()
    for step in range(cfg.steps):
        rows = [make_row(d, rng.randrange(2**31), rng.random() < cfg.slip_rate, cfg.slip)
                for d in (rng.choice(domains) for _ in range(cfg.batch_size))]
        ids, mask, labels = make_batch(rows, tok, "cpu")
        loss = train_step(model, opt, cfg, step, ids, mask, labels)
        seen += int(mask.sum())
        if step % 100 == 0 or step == cfg.steps - 1:
            el = time.perf_counter() - t0
            print(f"step {step:5d}  loss {loss.item():.4f}  lr {lr_at(cfg, step):.2e}  "
                  f"{seen / el:,.0f} tok/s  {el:.0f}s", flush=True)
    train_s, train_cpu_s = time.perf_counter() - t0, time.process_time() - cpu0

    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    model.eval()
    model.save_pretrained(out)
    tok.save_pretrained(out)
    (out / "policy_version.json").write_text(json.dumps({"name": "tiny-base", "parent": None}) + "\n")
    report: dict = {"config": dataclasses.asdict(cfg), "params": n_params,
                    "train_s": round(train_s, 1), "train_cpu_s": round(train_cpu_s, 1),
                    "final_loss": round(loss.item(), 4)}
    if cfg.eval_tasks:
        from posttrain.evaluation.quick import pass_rates
        from posttrain.policies.local import TorchPolicy

        policy = TorchPolicy(out, device="cpu")
        report["eval"] = pass_rates(policy, domains, n_tasks=cfg.eval_tasks, n_samples=cfg.eval_samples)
        for name, r in report["eval"].items():
            print(f"{name:18s} pass@1 {r['pass1']:.3f}  pass@{cfg.eval_samples} "
                  f"{r['passk']:.3f}  greedy {r['greedy']:.3f}")
    (out / "pretrain.json").write_text(json.dumps(report, indent=1) + "\n")
    return report


def parse_args() -> PretrainConfig:
    """Every PretrainConfig field is a --flag (with its docstring-free default shown)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for f in dataclasses.fields(PretrainConfig):
        parser.add_argument(f"--{f.name.replace('_', '-')}", type=type(f.default), default=f.default,
                            help=f"default: {f.default}")
    return PretrainConfig(**vars(parser.parse_args()))


if __name__ == "__main__":
    main(parse_args())
