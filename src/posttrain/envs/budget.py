"""Context budgets: how long observations are cut, visibly and countably.

An observation longer than its budget is cut with a marker that says how much was removed, e.g.
``[... 1234 characters cut ...]``, keeping the head, the tail, or both ends (middle). The environment
counts every cut (`Observation.truncated_chars`, trajectory counters); nothing is cut silently.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

TruncateMode = Literal["head", "tail", "middle"]


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
    text_only: bool = False
    """the policy reads no images: image domains show their declared textual fallback instead,
    and one without a fallback is refused (`posttrain.envs.vision`)"""

    def __post_init__(self) -> None:
        if self.observation_max_chars < 64:
            raise ValueError(f"EnvConfig.observation_max_chars must be >= 64, got {self.observation_max_chars}")
        if self.truncate not in ("head", "tail", "middle"):
            raise ValueError(f"EnvConfig.truncate must be 'head', 'tail' or 'middle', got {self.truncate!r}")
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
