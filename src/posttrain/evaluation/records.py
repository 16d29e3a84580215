"""What an evaluation keeps of each episode: a compact, JSON-able `Sample` per trajectory,
grouped by task into `TaskRecord`s. Summaries, A/B tests and baselines are computed from these.

Definitions (documented here because every table and figure uses them):

* `passed` is the verdict's `passed`; `None` for an `infra_error` episode, which is excluded from
  every score and counted separately.
* `prompt_tokens` is the sum over turns of the prompt length (what a server without prefix caching
  is billed), `output_tokens` the sum of generated tokens. Backends that return no token ids
  (scripted policies, some servers) get an estimate from characters (`chars_per_token`), and the
  sample says `tokens_estimated`.
* `runs` counts command executions (`bash`, `python` and domain tools) in a tools episode;
  `failed_runs` those that failed (non-zero exit, a limit, a tool error). A success is *reworked*
  when it had at least one failed run: it needed more than one attempt at running its
  tests/commands before succeeding.
* `sandbox_s` is tool time plus grading time for episodes that used a sandbox, tool time otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from posttrain.values.trajectory import Trajectory

EXECUTING_TOOLS_EXCLUDED = frozenset({"submit", "read_file", "write_file", "edit_file"})
"""tool calls that do not execute anything (every other tool name counts as a run)"""

CHARS_PER_TOKEN = 4.0
"""estimate used when a backend returns no token ids"""


@dataclass(slots=True)  # one per episode: no per-instance dict to build and scan
class Sample:
    index: int
    """sample number within its task (0..n-1); sample j of two policies has the same seed"""
    status: str
    passed: bool | None
    score: float | None
    turns: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0
    tokens_estimated: bool = False
    gen_s: float = 0.0
    tool_s: float = 0.0
    verify_s: float = 0.0
    sandbox_s: float = 0.0
    total_s: float = 0.0
    length_cut: bool = False
    runs: int = 0
    failed_runs: int = 0
    attempt: int = 0
    trajectory_id: str = ""
    error: str | None = None
    """'<where>: <Type>: <message>' of an infra_error"""

    @property
    def scored(self) -> bool:
        return self.passed is not None

    @property
    def reworked(self) -> bool:
        return bool(self.passed) and self.failed_runs > 0

    @classmethod
    def from_trajectory(cls, traj: Trajectory, index: int) -> Sample:
        prompt_tokens = output_tokens = 0
        estimated = False
        context_chars = 0
        runs = failed = 0
        for turn in traj.turns:
            context_chars += len(turn.observation)
            if turn.prompt_token_ids is not None:
                prompt_tokens += len(turn.prompt_token_ids)
            else:
                estimated = True
                prompt_tokens += int(context_chars / CHARS_PER_TOKEN) + 1
            if turn.token_ids is not None:
                output_tokens += len(turn.token_ids)
            else:
                estimated = True
                output_tokens += int(len(turn.action) / CHARS_PER_TOKEN) + (1 if turn.action else 0)
            context_chars += len(turn.action)
            for result in turn.tool_results:
                if result.get("name") not in EXECUTING_TOOLS_EXCLUDED:
                    runs += 1
                    failed += not result.get("ok", False)
        get = traj.timings.get
        tool_s, verify_s = get("tool_s", 0.0), get("verify_s", 0.0)
        sandbox_s = tool_s + (verify_s if traj.sandbox else 0.0)
        error = None
        if traj.error is not None:
            error = f"{traj.error.where}: {traj.error.type}: {traj.error.message[:300]}"
        # positional, in field order: one is built per episode, and keywords cost more
        return cls(index, traj.status, None if traj.status == "infra_error" else bool(traj.passed),
                   traj.reward, len(traj.turns), prompt_tokens, output_tokens, estimated,
                   round(get("gen_s", 0.0), 6), round(tool_s, 6), round(verify_s, 6), round(sandbox_s, 6),
                   round(get("total_s", 0.0), 6), traj.counters.get("length_cut", 0) > 0, runs, failed,
                   traj.attempt, traj.id, error)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Sample:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})


@dataclass(slots=True)
class TaskRecord:
    hash: str
    key: str
    domain: str
    family: str
    env: str
    split: str
    seed: int | None
    samples: list[Sample] = field(default_factory=list)

    @property
    def scored(self) -> list[Sample]:
        return [s for s in self.samples if s.scored]

    def by_index(self) -> dict[int, Sample]:
        """Sample index -> its last attempt (earlier attempts of an index are infra errors)."""
        return {s.index: s for s in self.samples}

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["samples"] = [s.to_dict() for s in self.samples]
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TaskRecord:
        d = dict(d)
        d["samples"] = [Sample.from_dict(s) for s in d.get("samples", [])]
        return cls(**d)
