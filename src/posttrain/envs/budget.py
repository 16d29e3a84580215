"""Context budgets: how long observations are cut, visibly and countably, and what an episode
does when its history outgrows the task's context.

An observation longer than its budget is cut with a marker that says how much was removed, e.g.
``[... 1234 characters cut ...]``, keeping the head, the tail, or both ends (middle). The environment
counts every cut (`Observation.truncated_chars`, trajectory counters); nothing is cut silently.

When the next prompt of a multi-turn episode would not fit its context budget, the context policy
decides (`EnvConfig.context_policy`): 'end' the episode (truncated, graded on what it did), or
'drop_oldest_tool_output': replace the oldest tool observations by a marker
``[output dropped: N chars]`` until the prompt fits, keeping the instruction (the first
observation), the last `KEEP_LAST_OBSERVATIONS` observations and every action of the model.
`plan_drops` is the decision, a pure function of token counts, so a replay decides the same.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

TruncateMode = Literal["head", "tail", "middle"]
ContextPolicy = Literal["end", "drop_oldest_tool_output"]
CONTEXT_POLICIES: tuple[ContextPolicy, ...] = ("end", "drop_oldest_tool_output")
KEEP_LAST_OBSERVATIONS = 2
"""observations never dropped at the end of the history: the one the model is about to answer
and the one before it (the result of its last two actions), which the next action builds on"""


@dataclass(frozen=True)
class EnvConfig:
    """Settings of the environments (one per run; tasks carry their own turn/token limits)."""

    observation_max_chars: int = 4000
    """a tool result longer than this is cut (with a visible marker)"""
    truncate: TruncateMode = "middle"
    """which part of a long observation is kept: 'head' (the start), 'tail' (the end), or
    'middle' (both ends, cutting the middle: errors usually sit at the end of output)"""
    show_files_in_prompt_chars: int = 6000
    """single-answer tasks with files show them inline up to this many characters in total"""
    snapshot_turns: bool = True
    """snapshot the workspace after every tool turn (ids recorded per turn; overlay snapshots
    cost a few ms), so an episode can be inspected or branched from any turn"""
    chars_per_token: float = 4.0
    """used to estimate tokens when a policy returns no token ids (scripted policies)"""
    context_policy: ContextPolicy = "end"
    """when an episode's next prompt would not fit the task's context budget: 'end' it (truncated,
    counted `context_budget_exhausted`), or 'drop_oldest_tool_output' (replace the oldest tool
    observations by '[output dropped: N chars]', keeping the instruction and the last two
    observations; recorded per turn in `Turn.dropped_observations`, replayed identically)"""
    text_only: bool = False
    """the policy reads no images: image domains show their declared textual fallback instead,
    and one without a fallback is refused (`posttrain.envs.vision`)"""

    def __post_init__(self) -> None:
        if self.observation_max_chars < 64:
            raise ValueError(f"EnvConfig.observation_max_chars must be >= 64, got {self.observation_max_chars}")
        if self.truncate not in ("head", "tail", "middle"):
            raise ValueError(f"EnvConfig.truncate must be 'head', 'tail' or 'middle', got {self.truncate!r}")
        if self.context_policy not in CONTEXT_POLICIES:
            raise ValueError(f"EnvConfig.context_policy must be one of {CONTEXT_POLICIES}, got {self.context_policy!r}")
        if self.chars_per_token <= 0:
            raise ValueError(f"EnvConfig.chars_per_token must be > 0, got {self.chars_per_token}")


def truncate_text(text: str, max_chars: int, mode: TruncateMode = "middle") -> tuple[str, int]:
    """(possibly cut text, number of characters cut). The result never exceeds max_chars by more
    than the marker's length."""
    if len(text) <= max_chars:
        return text, 0
    cut = len(text) - max_chars
    marker = f"[... {cut} characters cut ...]"
    if mode == "head":
        return text[:max_chars] + "\n" + marker, cut
    if mode == "tail":
        return marker + "\n" + text[-max_chars:], cut
    head = max_chars // 2
    tail = max_chars - head
    return text[:head] + "\n" + marker + "\n" + text[len(text) - tail:], cut


def dropped_marker(text: str) -> str:
    """What a dropped observation is replaced by: says how much is gone, never silently."""
    return f"[output dropped: {len(text)} chars]"


def plan_drops(sizes: Sequence[int], marker_sizes: Sequence[int], dropped: Sequence[int],
               overflow: int) -> list[int]:
    """Which observations to drop, oldest first, so that the prompt shrinks by at least `overflow`
    tokens (fewer when not enough can go; the caller then ends the episode if it still does not
    fit). `sizes[j]`: tokens of observation j as shown (j = 0 is the instruction, the last one
    the new observation); `marker_sizes[j]`: tokens of its marker; `dropped`: already replaced.
    An observation no larger than its marker is never dropped (nothing would be saved)."""
    if len(sizes) != len(marker_sizes):
        raise ValueError(f"plan_drops: {len(sizes)} sizes but {len(marker_sizes)} marker sizes")
    plan: list[int] = []
    saved = 0
    gone = set(dropped)
    for j in range(1, len(sizes) - KEEP_LAST_OBSERVATIONS):
        if saved >= overflow:
            break
        if j in gone or sizes[j] <= marker_sizes[j]:
            continue
        plan.append(j)
        saved += sizes[j] - marker_sizes[j]
    return plan
