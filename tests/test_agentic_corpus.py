"""tiny-agent's corpus builder (models/agentic_corpus.py): one tool call per turn, the habitual
slip, real observations, and rows that are exactly what a token-in/token-out episode shows."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))

import agentic_corpus as ac  # noqa: E402

from posttrain.envs.tools import DEFAULT_STOP  # noqa: E402
from posttrain.tasks.registry import get_domain  # noqa: E402


def test_a_turn_with_several_calls_becomes_one_turn_per_call():
    turns = ac.split_turns(["<bash>python3 t.py</bash>\n<submit>fixed</submit>", "<bash>ls</bash>"], DEFAULT_STOP)
    assert turns == ["<bash>python3 t.py</bash>", "<submit>fixed</submit>", "<bash>ls</bash>"]


def test_the_slip_nudges_a_read_off_answer():
    assert ac.slip(["<bash>wc -w < s.txt</bash>", "<submit>47</submit>"]) == \
        ["<bash>wc -w < s.txt</bash>", "<submit>48</submit>"]


def test_the_slip_nudges_the_last_edit_and_skips_the_checks():
    turns = ["<bash>python3 test_solution.py</bash>",
             '<edit path="solution.py"><old>    return vals[5]</old><new>    return vals[5 - 1]</new></edit>',
             "<bash>python3 test_solution.py</bash>", "<submit>fixed</submit>"]
    assert ac.slip(turns) == [turns[0], turns[1].replace("5 - 1]", "5 - 2]"), "<submit>fixed</submit>"]
    model = ['<tool name="model">save(cone(3, 4).translate(0, 0, 2), \'model.json\')</tool>', "<submit></submit>"]
    assert ac.slip(model)[0] == model[0].replace("0, 0, 2)", "0, 0, 3)")  # a dimension, not the file name
    assert ac.slip(['<write path="a.txt">ok</write>', "<submit></submit>"])[0] == '<write path="a.txt">ol</write>'


def test_the_reading_phase_draws_whole_transcripts_that_end_in_a_read_off_answer():
    import pretrain_agent as pa

    def transcript(seed: int, answer: str) -> ac.Transcript:
        return ac.Transcript("terminal.count.words", seed, ["How many words?", "[bash] exit 0\n12"],
                             ["<bash>wc -w < s.txt</bash>", f"<submit>{answer}</submit>"], ["</bash>", "</submit>"],
                             False, 1.0)

    counts, done = [transcript(s, f"{s}2") for s in range(4)], [transcript(9, "fixed"), transcript(8, "")]
    assert [ac.read_off(t.actions[-1]) for t in (counts[0], *done)] == [True, False, False]
    assert ac.read_off("<submit>logs/a.txt</submit>") and ac.read_off('<submit>{"n": 1}</submit>')
    tok = pa.build_bpe([x for t in counts + done for x in pa.transcript_texts(t)] * 5, 300)
    cfg = pa.AgentPretrainConfig(single_share=0.0, read_mix=1.0, n_positions=128)
    rows = pa.Rows(cfg, counts + done, [], tok, random.Random(0))
    assert rows.reading == counts
    wholes = [pa.encode_row(tok, t, 1) for t in counts]
    assert all(rows.one(reading_phase=True) in wholes for _ in range(20))  # whole, and only reading ones
    drawn = [rows.one() for _ in range(40)]  # the mix: any transcript, cut after any turn
    assert any(r not in wholes for r in drawn)
    with pytest.raises(ValueError, match="read_mix"):
        pa.AgentPretrainConfig(read_mix=1.5)
    with pytest.raises(ValueError, match="read_steps > 0 but no transcript"):
        pa.Rows(cfg, done, [], tok, random.Random(0))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["terminal.count.words", "code.repair.list.kth"])
def test_slipped_transcripts_fail_and_clean_ones_pass_in_the_real_sandbox(name):
    got = ac.tool_transcripts(get_domain(name), [1, 2, 3], 1.0, random.Random(0), workers=2)
    assert len(got) == 3
    assert all(t.slipped and t.reward == 0.0 for t in got)
    clean = ac.tool_transcripts(get_domain(name), [1], 0.0, random.Random(0), workers=1)
    assert not clean[0].slipped and clean[0].reward == 1.0
    assert len(clean[0].actions) >= 2 and clean[0].observations[1].startswith("[bash] exit")


@pytest.mark.slow
def test_rows_are_the_token_in_token_out_history_with_loss_on_actions_only():
    from posttrain.policies.render import continue_ids, render_ids
    from posttrain.values.generation import Message

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
    import pretrain_agent as pa

    t = ac.Transcript("terminal.count.words", 0, ["How many words?", "[bash] exit 0\n12"],
                      ["<bash>wc -w < s.txt</bash>", "<submit>12</submit>"], ["</bash>", "</submit>"], False, 1.0)
    tok = pa.build_bpe(pa.transcript_texts(t) * 5, 300)
    ids, labels = pa.encode_row(tok, t, 1)
    first = render_ids(tok, [Message("user", t.observations[0])])
    act0 = tok("<bash>wc -w < s.txt</bash>", add_special_tokens=False)["input_ids"]  # the stop tag kept
    prompt1 = continue_ids(tok, first + act0, [Message("user", t.observations[1])])
    assert ids[:len(prompt1)] == prompt1  # the history the episode will build, id for id
    trained = [i for i, lab in zip(ids, labels) if lab != -100]
    assert trained == act0 + tok("<submit>12</submit>", add_special_tokens=False)["input_ids"]


@pytest.mark.slow
def test_pretraining_resumes_from_its_snapshot_to_the_same_weights(tmp_path, monkeypatch):
    import pretrain_agent as pa
    import torch

    corpus = [ac.Transcript("terminal.count.words", s, [f"How many words in story{s}.txt?", "[bash] exit 0\n12"],
                            [f"<bash>wc -w < story{s}.txt</bash>", f"<submit>{s}2</submit>"], ["</bash>", "</submit>"],
                            False, 1.0) for s in range(8)]
    monkeypatch.setattr(pa, "build", lambda cfg: corpus)
    monkeypatch.setattr(pa, "single_domains", lambda: [])
    # 3 steps of the mix, then 4 of the reading phase; killed inside the reading phase (its fresh
    # optimizer and its own schedule must come back from the snapshot)
    small = dict(vocab_size=300, single_share=0.0, steps=3, read_steps=4, batch_size=2, warmup_steps=1, n_embd=16,
                 n_layer=1, n_head=2, n_positions=128, threads=1, eval_tasks=0, save_every=2)

    def weights(out):
        from safetensors.torch import load_file
        return load_file(str(out / "model.safetensors"))

    whole = tmp_path / "whole"
    pa.main(pa.AgentPretrainConfig(out=str(whole), **small))
    assert not (whole / ".partial").exists()  # removed once the model is written

    killed = tmp_path / "killed"
    real, calls = pa.pad_batch, []

    def dies_at_step_6(*a):
        calls.append(1)
        if len(calls) == 6:
            raise KeyboardInterrupt
        return real(*a)

    monkeypatch.setattr(pa, "pad_batch", dies_at_step_6)
    with pytest.raises(KeyboardInterrupt):
        pa.main(pa.AgentPretrainConfig(out=str(killed), **small))
    assert torch.load(killed / ".partial" / "state.pt", weights_only=False)["step"] == 4  # in the reading phase
    monkeypatch.setattr(pa, "pad_batch", real)
    report = pa.main(pa.AgentPretrainConfig(out=str(killed), **small))
    a, b = weights(whole), weights(killed)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert report["tokens_seen"] > 0


def test_the_shipped_tiny_agent_is_what_the_script_makes_by_default():
    """`models/pretrain_agent.py` with no flags is the command models/README.md gives: the
    committed weights' recorded settings must be its defaults."""
    import dataclasses
    import json

    import pretrain_agent as pa

    recorded = json.loads((Path(__file__).resolve().parents[1] / "models/tiny-agent/pretrain.json").read_text())
    assert recorded["config"] == dataclasses.asdict(pa.AgentPretrainConfig())
