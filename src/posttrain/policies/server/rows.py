"""The per-request state `BatchEngine` keeps for each row in flight, and its counters; shared by
the decode loop (`engine.py`) and fast mode's draft verification (`verify.py`)."""

from __future__ import annotations

import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import torch

from posttrain.values.generation import SamplingParams


@dataclass
class Row:
    """One request in flight: its prompt, settings, what it has generated so far and its state
    in the batch."""

    prompt: list[int]
    sampling: SamplingParams
    future: Future
    limit: int
    generator: torch.Generator | None
    ignore_eos: bool = False
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    tail: str = ""
    reused: int = 0
    t0: float = field(default_factory=time.perf_counter)
    finish: str = ""
    epoch: int = 0
    """the cache epoch the row was admitted in: a row whose keys/values were computed before a
    reload (or a cache reset) never enters the prefix cache"""
    pending: int | None = None
    """fast mode: a token already emitted (the one that disagreed with a draft) and not yet fed;
    the row has no next-token logits until it is"""
    depth: int = 4
    """fast mode: the row's next draft length (doubles while drafts are accepted in full)"""
    pin: Any = None
    """the prefix cache's handle on the row's prompt path, kept from eviction while it runs"""
    draft: list[int] = field(default_factory=list)
    accepted: int = 0
    """fast mode: the last step's draft and how much of it was accepted, told to the drafter
    with the token fed next (a draft model retracts the rest and computes the rest at once)"""


@dataclass
class EngineStats:
    """What the engine has done since it started (read by tests and benchmarks)."""

    requests: int = 0
    tokens: int = 0
    steps: int = 0
    """decode forwards (each emits one token for every row in flight)"""
    row_steps: int = 0
    reloads: int = 0
    max_rows: int = 0
    drafted: int = 0
    """fast mode: draft tokens fed for verification, and those accepted"""
    accepted: int = 0
