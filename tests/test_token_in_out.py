"""Token-in/token-out multi-turn episodes: turn k+1's prompt ids are turn k's prompt ids, its
completion ids as sampled, then the new observation's ids; the history is never re-tokenized."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from posttrain.policies.local import TorchPolicy
from posttrain.policies.render import continue_ids, render_ids
from posttrain.scheduling.engine import run_episodes
from posttrain.tasks.registry import get_domain
from posttrain.values.generation import GenerationRequest, Message, SamplingParams

TEXTS = ["[bash] exit 0\n42\n", "<bash>wc -w < story.txt</bash>", "How many words does story.txt have?",
         "Files in the workspace: story.txt", "<submit>17</submit>", "[parse error] no tool call found"] * 20


def bpe_dir(tmp_path: Path) -> Path:
    """A randomly initialised GPT-2 with a small byte-level BPE: its random samples are
    non-canonical token sequences, which re-tokenizing their text would change."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(TEXTS, trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<pad>", "<bos>", "<eos>", "<unk>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 1)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>",
                                   pad_token="<pad>", unk_token="<unk>")
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=len(fast), n_positions=1024, n_embd=32, n_layer=1,
                                       n_head=2, bos_token_id=1, eos_token_id=2, pad_token_id=0))
    model.save_pretrained(tmp_path)
    fast.save_pretrained(tmp_path)
    return tmp_path


def test_continue_ids_appends_only_the_new_messages(bpe_model_dir):
    policy = TorchPolicy(bpe_model_dir, device="cpu")
    tok = policy.tokenizer
    first = render_ids(tok, [Message("user", "How many words?")])
    sampled = [5, 9, 300]  # any ids the model produced, canonical or not
    msgs = (Message("user", "How many words?"), Message("assistant", tok.decode(sampled)),
            Message("user", "[bash] exit 0"))
    ids = continue_ids(tok, first + sampled, msgs[2:])
    assert ids[:len(first) + 3] == first + sampled
    assert ids[len(first) + 3:] == tok("\n[bash] exit 0", add_special_tokens=False)["input_ids"]
    request = GenerationRequest(msgs, prefix_ids=tuple(first + sampled), prefix_messages=2)
    assert policy.render(request) == ids
    with pytest.raises(ValueError, match="prefix_messages"):
        GenerationRequest(msgs, prefix_ids=(1, 2), prefix_messages=3)


def test_turn_prompts_extend_the_sampled_history(bpe_model_dir):
    policy = TorchPolicy(bpe_model_dir, device="cpu")
    domain = get_domain("terminal.count.words")
    tasks = []
    for seed in range(3):
        task = domain.task(seed, "train")
        tasks.append((domain, task.model_copy(update={"limits": task.limits.model_copy(update={"max_turns": 3})})))
    torch.manual_seed(0)
    trajs = run_episodes(tasks, policy, SamplingParams(temperature=1.0, max_tokens=12))
    turns = [(t.turns[k], t.turns[k + 1]) for t in trajs for k in range(len(t.turns) - 1)]
    assert len(turns) >= 4, [(t.status, len(t.turns), t.error) for t in trajs]
    retokenized_differs = False
    for before, after in turns:
        history = before.prompt_token_ids + before.token_ids
        assert after.prompt_token_ids[:len(history)] == history
        tail = "\n" + after.observation
        assert after.prompt_token_ids[len(history):] == policy.tokenizer(tail, add_special_tokens=False)["input_ids"]
        text = policy.tokenizer.decode(before.token_ids)
        retokenized_differs |= policy.tokenizer(text, add_special_tokens=False)["input_ids"] != before.token_ids
    # the check above is not vacuous: re-tokenizing the sampled text would have changed the ids
    assert retokenized_differs
