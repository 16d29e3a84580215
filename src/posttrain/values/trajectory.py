"""`Trajectory`: one recorded attempt at one task, enough to re-score, retrain on or re-run it.

Status is one of:

* `completed`   -- the episode ended on its own terms and was verified (reward set);
* `truncated`   -- a budget (turns, tokens, time) ended it; it is still verified (reward set);
* `infra_error` -- the machinery failed (sandbox died, verifier crashed, policy backend down).
  `reward` is None and `error` says what happened. Such a trajectory is never trained on and
  never counted as a failed answer; the scheduler retries the task.
"""

from __future__ import annotations

import traceback as _tb
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

from posttrain.values.image import Image
from posttrain.values.verdict import Verdict

Status = Literal["completed", "truncated", "infra_error"]
STATUSES: tuple[Status, ...] = ("completed", "truncated", "infra_error")


@dataclass(frozen=True)
class ErrorInfo:
    """An infrastructure failure, as data."""

    type: str
    message: str
    traceback: str = ""
    where: str = ""
    """'sandbox' | 'policy' | 'verifier' | 'env' | 'runner' | 'context' (the task's first prompt
    does not fit the model's context: deterministic, so never retried; counts against the domain)"""

    @property
    def retryable(self) -> bool:
        """Whether running the episode again could end otherwise (not for 'context')."""
        return self.where != "context"

    @classmethod
    def from_exception(cls, exc: BaseException, where: str) -> ErrorInfo:
        return cls(type=type(exc).__name__, message=str(exc)[:2000],
                   traceback="".join(_tb.format_exception(exc))[-8000:], where=where)


@dataclass
class Turn:
    index: int
    observation: str
    """what the policy was shown before acting (after context-budget truncation)"""
    action: str
    """the model text of this turn"""
    prompt_token_ids: list[int] | None = None
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    finish_reason: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    tool_results: list[dict[str, Any]] = field(default_factory=list)
    parse_error: str | None = None
    observation_truncated_chars: int = 0
    snapshot_id: str | None = None
    gen_s: float = 0.0
    tool_s: float = 0.0
    prefill_tokens: int = 0
    """prompt tokens the policy computed for this turn (0 when its backend does not say)"""
    reused_tokens: int = 0
    """prompt tokens whose keys/values came from a prefix cache (the episode's earlier turns);
    with `prefill_tokens`, the turn's prompt, when the backend reports them"""
    dropped_observations: list[int] = field(default_factory=list)
    """turns whose observation this turn's prompt showed as a marker instead (the context policy
    'drop_oldest_tool_output', `posttrain.envs.budget`); empty: the whole history was shown"""
    observation_images: list[dict[str, Any]] = field(default_factory=list)
    """the images shown with `observation`, in order, as `Image.ref()` ({sha256, mime, bytes});
    the bytes are in `Trajectory.images` and, once stored, in the store's image table"""


@dataclass
class Trajectory:
    task_key: str
    task_hash: str
    domain: str
    split: str
    policy_version: str
    status: Status
    turns: list[Turn] = field(default_factory=list)
    verdict: Verdict | None = None
    reward: float | None = None
    error: ErrorInfo | None = None
    sampling: Mapping[str, Any] = field(default_factory=dict)
    seed: int | None = None
    group_id: str = ""
    """trajectories sampled together for one task (a GRPO group) share this id"""
    attempt: int = 0
    """0 for the first try; retries of an infra_error increment it"""
    member: int = 0
    """this sample's place in its group (0..G-1); (run_id, group_id, member, attempt) is the
    trajectory's identity, under which the store keeps it exactly once"""
    run_id: str = ""
    sandbox: Mapping[str, Any] = field(default_factory=dict)
    """backend, image hash and active isolation layers"""
    verifier_version: str = ""
    tokenizer_hash: str = ""
    final_workspace_sha256: str | None = None
    """hash of the final workspace archive (stored beside the trajectory) for workspace tasks"""
    timings: dict[str, float] = field(default_factory=dict)
    """gen_s, tool_s, verify_s, total_s, queue_s"""
    counters: dict[str, int] = field(default_factory=dict)
    """parse_errors, tool_errors, observation_truncations, ..."""
    policy_staleness: int = 0
    """how many policy versions behind the trainer this sample was generated"""
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created_at: float = 0.0
    images: dict[str, Image] = field(default_factory=dict, compare=False, repr=False)
    """sha256 -> image, for every image a turn refers to: the bytes travel with the trajectory
    to the store, which keeps each hash once. Not part of `to_dict` (the refs are)"""

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"Trajectory.status must be one of {STATUSES}, got {self.status!r}")
        if self.status == "infra_error":
            if self.reward is not None:
                raise ValueError("an infra_error trajectory has no reward (it is never scored 0)")
            if self.error is None:
                raise ValueError("an infra_error trajectory must carry its error")
        elif self.reward is None:
            raise ValueError(f"a {self.status} trajectory must carry its reward")

    @property
    def trainable(self) -> bool:
        return self.status in ("completed", "truncated")

    @property
    def passed(self) -> bool | None:
        return None if self.verdict is None else self.verdict.passed

    def to_dict(self) -> dict[str, Any]:
        d = asdict(replace(self, images={}) if self.images else self)
        d.pop("images")
        d["verdict"] = self.verdict.to_dict() if self.verdict else None
        d["sampling"] = dict(self.sampling)
        d["sandbox"] = dict(self.sandbox)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Trajectory:
        d = dict(d)
        d["turns"] = [Turn(**t) for t in d.get("turns") or []]
        d["verdict"] = Verdict.from_dict(d["verdict"]) if d.get("verdict") else None
        d["error"] = ErrorInfo(**d["error"]) if d.get("error") else None
        return cls(**d)
