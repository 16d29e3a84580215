"""Pretrain `models/tiny-agent` from scratch, on CPU: a base model for multi-turn tool use.

    .venv/bin/python models/pretrain_agent.py                     # the shipped model (seeded)
    .venv/bin/python models/pretrain_agent.py --steps 50 --out /tmp/agent   # a quick try

Read top to bottom: settings, the BPE tokenizer, the rows, the loop, the save, a short
evaluation. The corpus (`models/agentic_corpus.py`, transcripts of the registry's own episodes
with a latent-skill slip) and the choices are described in `models/README.md`. What matters here:

* **rows are token-in/token-out transcripts**: each segment is tokenized on its own, exactly as
  an episode builds its prompts (`posttrain.policies.render.continue_ids`): `<bos>` + the first
  observation, then for every turn the action's tokens and the tokens of "\\n" + the next
  observation. A row is a transcript cut after a random turn k: loss on the actions' tokens,
  each with the stop string that ends it (a closing tag) or `<eos>`, never on observations;
* every action appears as the policy keeps it: with the tokens of its stop string (a policy's
  `token_ids` keep them, as vLLM's do, and the next turn's prompt continues from them), so the
  history the model is trained on is the history it will see, and the stop decision is trained;
* rows are trained at their real length (candidates sorted by length into batches), not padded
  to the context: long rows cost several times more per token.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import shutil
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from agentic_corpus import (  # noqa: E402 - the sibling script, not a package
    HELD_OUT,
    TRAINED,
    CorpusConfig,
    Transcript,
    build,
    read_off,
    single_domains,
    single_transcript,
)
from pretrain import SPECIALS, lr_at, new_model, new_optimizer, train_step  # noqa: E402
from pretrain import build_tokenizer as char_tokenizer

TAG = r"</?[a-z_]+>"
"""tool tags are whole pre-tokens, so an action's tokens never run into its stop string"""


@dataclass
class AgentPretrainConfig:
    out: str = "models/tiny-agent"
    vocab_size: int = 2048
    """BPE vocabulary (0 = the character tokenizer of tiny-base, for comparison)"""
    single_share: float = 0.15
    """share of rows drawn from single-answer domains (the rest: tool-use transcripts)"""
    slip_rate: float = 0.35
    steps: int = 2000
    read_steps: int = 300
    """closing steps where a share `read_mix` of the rows are reading rows: the tool-use transcripts
    that end by submitting an answer read off an observation (`agentic_corpus.read_off`: a count, a
    path), whole; the rest are drawn as before. A fresh optimizer, its own warm-up and cosine from
    `read_lr`. Copying a number out of a tool's output is a skill the whole mix does not teach a
    model this small: after 2,000 steps of it, tiny-agent copied a count's first digit and guessed
    the second (models/README.md, "tiny-agent")"""
    read_lr: float = 1e-3
    read_mix: float = 0.6
    batch_size: int = 12
    lr: float = 2e-3
    warmup_steps: int = 40
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    n_embd: int = 192
    n_layer: int = 4
    n_head: int = 6
    n_positions: int = 1024
    seed: int = 0
    threads: int = 2
    eval_tasks: int = 10
    """eval-split tasks per trained / held-out agentic domain for the closing report (0 = skip)"""
    eval_samples: int = 8
    save_every: int = 50
    """steps between resumable snapshots in <out>/.partial (0 = none): on a shared machine the
    run can take hours of wall time; rerunning the same command continues from the last one,
    with the same batches and the same result as an uninterrupted run"""

    def __post_init__(self) -> None:
        if self.read_steps < 0:
            raise ValueError(f"AgentPretrainConfig.read_steps must be >= 0, got {self.read_steps}")
        if not 0 <= self.read_mix <= 1:
            raise ValueError(f"AgentPretrainConfig.read_mix must be in [0, 1], got {self.read_mix}")
        for name in ("steps", "batch_size", "n_embd", "n_layer", "n_head", "n_positions", "threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"AgentPretrainConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.n_embd % self.n_head:
            raise ValueError(f"AgentPretrainConfig.n_embd ({self.n_embd}) must be a multiple of n_head")
        if not 0 <= self.single_share <= 1:
            raise ValueError(f"AgentPretrainConfig.single_share must be in [0, 1], got {self.single_share}")


def build_bpe(texts: list[str], vocab_size: int):
    """A byte-level BPE `PreTrainedTokenizerFast` trained on `texts`: digits one per token (numbers
    are copied digit by digit), tool tags whole, `<bos>` prepended."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(TAG), behavior="isolated"),
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIALS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    bos = tok.token_to_id("<bos>")
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", bos)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>",
                                   pad_token="<pad>", unk_token="<unk>")


def transcript_texts(t: Transcript) -> list[str]:
    return [o for o in t.observations] + list(t.actions)


def encode_row(tok, t: Transcript, k: int) -> tuple[list[int], list[int]]:
    """(ids, labels) of transcript `t` cut after turn k (see the module docstring)."""
    ids = list(tok(t.observations[0])["input_ids"])
    labels = [-100] * len(ids)
    for i in range(k + 1):
        action, stop = t.actions[i], t.stops[i]
        a = tok(action, add_special_tokens=False)["input_ids"]
        if not stop:
            a = a + [tok.eos_token_id]
        ids += a
        labels += a
        if i < k:
            o = tok("\n" + t.observations[i + 1], add_special_tokens=False)["input_ids"]
            ids += o
            labels += [-100] * len(o)
    return ids, labels


def pad_batch(rows: list[tuple[list[int], list[int]]], pad: int) -> tuple[torch.Tensor, ...]:
    width = max(len(r[0]) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    lab = torch.full((len(rows), width), -100, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (s, lb) in enumerate(rows):
        ids[i, :len(s)], lab[i, :len(s)], mask[i, :len(s)] = torch.tensor(s), torch.tensor(lb), 1
    return ids, mask, lab


class Rows:
    """Draws training rows: tool-use transcripts from the cached corpus, single-answer ones on
    the fly; rows longer than the context are dropped (and counted)."""

    def __init__(self, cfg: AgentPretrainConfig, tool: list[Transcript], singles, tok, rng: random.Random):
        self.cfg, self.tool, self.singles, self.tok, self.rng = cfg, tool, singles, tok, rng
        self.reading = [t for t in tool if read_off(t.actions[-1])]
        if cfg.read_steps and not self.reading:
            raise ValueError("AgentPretrainConfig.read_steps > 0 but no transcript of the corpus ends by "
                             "submitting an answer read off an observation")
        self.dropped = 0

    def one(self, reading_phase: bool = False) -> tuple[list[int], list[int]]:
        while True:
            if reading_phase and self.rng.random() < self.cfg.read_mix:  # whole: the answer is the point
                t = self.rng.choice(self.reading)
                k = len(t.actions) - 1
            else:
                if self.rng.random() < self.cfg.single_share:
                    d = self.rng.choice(self.singles)
                    t = single_transcript(d, self.rng.randrange(2**31), self.rng.random() < self.cfg.slip_rate)
                else:
                    t = self.rng.choice(self.tool)
                k = self.rng.randrange(len(t.actions))
            row = encode_row(self.tok, t, k)
            if len(row[0]) <= self.cfg.n_positions:
                return row
            self.dropped += 1

    def batches(self, n: int, reading_phase: bool = False) -> list[list[tuple[list[int], list[int]]]]:
        """n batches from n x batch_size rows sorted by length (little padding)."""
        rows = sorted((self.one(reading_phase) for _ in range(n * self.cfg.batch_size)),
                      key=lambda r: len(r[0]))
        out = [rows[i:i + self.cfg.batch_size] for i in range(0, len(rows), self.cfg.batch_size)]
        self.rng.shuffle(out)
        return out


def tokens_per_transcript(tok, corpus: list[Transcript]) -> float:
    return statistics.mean(len(encode_row(tok, t, len(t.actions) - 1)[0]) for t in corpus)


def main(cfg: AgentPretrainConfig) -> dict:

    torch.set_num_threads(cfg.threads)
    random.seed(cfg.seed)
    np.random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    rng = random.Random(cfg.seed)
    t_corpus = time.perf_counter()
    tool = build(CorpusConfig(slip_rate=cfg.slip_rate, seed=cfg.seed))
    singles = single_domains()
    corpus_s = time.perf_counter() - t_corpus
    sample_singles = [single_transcript(d, s, False) for d in singles for s in range(20)]
    texts = [x for t in tool + sample_singles for x in transcript_texts(t)]
    partial = Path(cfg.out) / ".partial"
    state = None
    if (partial / "state.pt").is_file():
        state = torch.load(partial / "state.pt", weights_only=False)
        if state["config"] != dataclasses.asdict(cfg):
            raise ValueError(f"{partial}: a snapshot of other settings ({state['config']}); "
                             f"delete it or rerun with those settings")
    if state is not None:
        from transformers import PreTrainedTokenizerFast

        tok = PreTrainedTokenizerFast.from_pretrained(partial)
    else:
        tok = build_bpe(texts, cfg.vocab_size) if cfg.vocab_size else char_tokenizer()
    probe = rng.sample(tool, min(300, len(tool)))
    per_transcript = {"bpe": tokens_per_transcript(tok, probe),
                      "char": tokens_per_transcript(char_tokenizer(), probe)}
    corpus_domains = sorted({t.domain for t in tool} | {d.name for d in singles})
    print(f"corpus: {len(tool)} tool-use transcripts, {len(corpus_domains)} domains "
          f"({len(singles)} single-answer); tokens per transcript: {per_transcript['bpe']:.0f} "
          f"({len(tok)} ids) vs {per_transcript['char']:.0f} characters", flush=True)

    model = new_model(tok, cfg)
    n_params = sum(p.numel() for p in model.parameters())
    opt = new_optimizer(model, cfg)

    print(f"model: GPT-2 {cfg.n_layer}x{cfg.n_embd}, {n_params / 1e6:.2f}M parameters, "
          f"{cfg.n_positions} positions", flush=True)
    rows = Rows(cfg, tool, singles, tok, rng)
    t0, cpu0, seen, queue, loss = time.perf_counter(), time.process_time(), 0, [], torch.tensor(0.0)
    first, before_s, before_cpu_s = 0, 0.0, 0.0
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        rng.setstate(state["rng"])
        first, seen, queue, rows.dropped = state["step"], state["seen"], state["queue"], state["dropped"]
        before_s, before_cpu_s = state["train_s"], state["train_cpu_s"]
        print(f"resuming from {partial} at step {first}", flush=True)
    # the reading phase's schedule: its own warm-up and cosine over its steps
    read_cfg = dataclasses.replace(cfg, lr=cfg.read_lr, warmup_steps=min(10, cfg.read_steps),
                                   steps=max(1, cfg.read_steps))
    total = cfg.steps + cfg.read_steps
    model.train()
    for step in range(first, total):
        reading = step >= cfg.steps
        if step == cfg.steps:  # the phase starts with a fresh optimizer and its own batches
            opt, queue = new_optimizer(model, read_cfg), []
        if not queue:  # a queue never spans the two phases
            queue = rows.batches(8 if reading else min(8, cfg.steps - step), reading)
        ids, mask, labels = pad_batch(queue.pop(), tok.pad_token_id)
        sched, at = (read_cfg, step - cfg.steps) if reading else (cfg, step)  # whose schedule, where in it
        loss = train_step(model, opt, sched, at, ids, mask, labels)
        seen += int(mask.sum())
        if step % 50 == 0 or step in (cfg.steps - 1, total - 1):
            el = time.perf_counter() - t0
            print(f"step {step:5d}  loss {loss.item():.4f}  lr {lr_at(sched, at):.2e}  {'reading  ' if reading else ''}"
                  f"{(step + 1 - first) / el:.3f} steps/s  {before_s + el:.0f}s  "
                  f"{before_cpu_s + time.process_time() - cpu0:.0f} CPU-s", flush=True)
        if cfg.save_every and (step + 1) % cfg.save_every == 0 and step + 1 < total:
            partial.mkdir(parents=True, exist_ok=True)
            tok.save_pretrained(partial)
            snapshot = {"config": dataclasses.asdict(cfg), "step": step + 1, "model": model.state_dict(),
                        "opt": opt.state_dict(), "rng": rng.getstate(), "queue": queue, "seen": seen,
                        "dropped": rows.dropped, "train_s": before_s + time.perf_counter() - t0,
                        "train_cpu_s": before_cpu_s + time.process_time() - cpu0}
            torch.save(snapshot, partial / "state.tmp")
            (partial / "state.tmp").replace(partial / "state.pt")  # atomic: a kill never leaves half
    train_s = before_s + time.perf_counter() - t0
    train_cpu_s = before_cpu_s + time.process_time() - cpu0

    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    model.eval()
    model.save_pretrained(out)
    tok.save_pretrained(out)
    (out / "policy_version.json").write_text(json.dumps({"name": "tiny-agent", "parent": None}) + "\n")
    shutil.rmtree(partial, ignore_errors=True)
    report: dict = {"config": dataclasses.asdict(cfg), "params": n_params, "corpus_s": round(corpus_s, 1),
                    "corpus_transcripts": len(tool), "corpus_domains": len(corpus_domains),
                    "tokens_per_transcript": {k: round(v, 1) for k, v in per_transcript.items()},
                    "rows_dropped_too_long": rows.dropped, "tokens_seen": seen,
                    "train_s": round(train_s, 1), "train_cpu_s": round(train_cpu_s, 1),
                    "reading_transcripts": len(rows.reading),
                    "steps_per_s": round(total / train_s, 4), "final_loss": round(loss.item(), 4)}
    if cfg.eval_tasks:
        report["eval"] = evaluate_agent(out, cfg.eval_tasks, cfg.eval_samples)
    (out / "pretrain.json").write_text(json.dumps(report, indent=1) + "\n")
    return report


def evaluate_agent(path: Path, n_tasks: int, n_samples: int) -> dict:
    """pass@1 / pass@k / greedy on the eval split of the agentic job's domains."""
    from posttrain.evaluation.quick import pass_rates
    from posttrain.policies.local import TorchPolicy
    from posttrain.tasks.registry import get_domain

    policy = TorchPolicy(path, device="cpu")
    result = pass_rates(policy, [get_domain(n) for n in TRAINED + HELD_OUT], n_tasks=n_tasks,
                      n_samples=n_samples, max_tokens=160, workers=2)
    for name, r in result.items():
        print(f"{name:32s} pass@1 {r['pass1']:.3f}  pass@{n_samples} {r['passk']:.3f}  greedy {r['greedy']:.3f}")
    return result


def parse_args() -> AgentPretrainConfig:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for f in dataclasses.fields(AgentPretrainConfig):
        parser.add_argument(f"--{f.name.replace('_', '-')}", type=type(f.default), default=f.default,
                            help=f"default: {f.default}")
    return AgentPretrainConfig(**vars(parser.parse_args()))


if __name__ == "__main__":
    main(parse_args())
