"""The agentic job's shipped config and its live view."""

from __future__ import annotations

import sys
from pathlib import Path

from rich.console import Console

from posttrain.pipeline.config import load_config
from posttrain.pipeline.progress import RoundProgress
from posttrain.tasks.registry import get_domain

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "models"))

import agentic_corpus as ac  # noqa: E402


def test_the_config_trains_what_the_corpus_prepared_for():
    cfg = load_config(ROOT / "configs" / "agentic.toml")
    assert cfg.model.path == "models/tiny-agent"
    # every RL domain, trained or held out, is one of the corpus's tool-use domains (the pretrained
    # model knows its tools and format); the held-out ones are those the corpus prepared as such
    corpus = {d.name for d in ac.tool_domains()}
    assert set(cfg.domains.train) <= corpus and tuple(cfg.domains.heldout) == ac.HELD_OUT
    # and the domains RL trains are those the corpus gave many transcripts (a domain trained on a
    # handful of memorised transcripts shows luck at pass@8, not a skill RL can make reliable)
    assert tuple(cfg.domains.train) == ac.TRAINED
    trained = [get_domain(n) for n in cfg.domains.train]
    held = [get_domain(n) for n in cfg.domains.heldout]
    assert len(trained) >= 8 and len(held) >= 4
    assert all(d.env == "tools" for d in trained + held)  # every one sandboxed and multi-turn
    assert len({d.family for d in trained}) >= 3
    assert not set(cfg.domains.train) & set(cfg.domains.heldout)


def test_the_live_table_shows_turns_and_tool_calls_per_domain():
    console = Console(record=True, width=120, force_terminal=False)
    view = RoundProgress(console, "GRPO agentic", 10, ["terminal.count.words", "geometry.cone.dims"])
    view.update(1, {"reward_mean": 0.5}, {"terminal.count.words": [1.0, 0.0]},
                {"terminal.count.words": [(2, 2), (4, 3)]})
    console.print(view._render())
    text = console.export_text()
    def cells(domain: str) -> list[str]:
        row = next(line for line in text.splitlines() if domain in line)
        return [c.strip() for c in row.split("│")]

    assert cells("terminal.count.words")[-2:] == ["3.0", "2.5"]  # mean turns, mean tool calls
    assert cells("geometry.cone.dims")[-2:] == ["-", "-"]
    assert "tool calls" in text
