"""`Task`: one problem instance, immutable, with a stable key and a content hash.

The `reference` (and anything under `verifier`) is hidden: environments show a policy only
`prompt` and `files`. Trajectories record `key` and `hash` so a stored attempt can always be tied
back to exactly the task it was made on.
"""

from __future__ import annotations

import hashlib
import json
from functools import cached_property
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

EnvKind = Literal["single", "tools"]
Split = Literal["train", "eval"]


def canonical_json(value: Any) -> str:
    """JSON with sorted keys and no whitespace: the form every hash in posttrain is taken of."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False)


def sha256_text(text: str | bytes) -> str:
    data = text.encode() if isinstance(text, str) else text
    return hashlib.sha256(data).hexdigest()


class TaskLimits(BaseModel):
    """Budgets of one episode on this task."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_turns: int = Field(1, ge=1, le=1000, description="policy turns before the episode is truncated")
    max_tokens: int = Field(64, ge=1, description="new tokens per turn")
    context_tokens: int = Field(2048, ge=16, description="token budget of the whole episode")
    time_s: float = Field(60.0, gt=0, description="wall time of the whole episode")
    command_timeout_s: float = Field(10.0, gt=0, description="wall timeout of one tool command")
    memory_mb: int = Field(1024, ge=16, description="sandbox memory")


class Task(BaseModel):
    """One problem instance. Build it with keyword arguments or `Task.model_validate(dict)`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    domain: str = Field(min_length=1, description="task type, e.g. 'math.add.d2'")
    prompt: str = Field(description="what the policy is shown")
    files: dict[str, str] = Field(default_factory=dict,
                                  description="initial workspace files: relative path -> text")
    reference: Any = Field(None, description="hidden expected answer / solution data")
    verifier: dict[str, Any] = Field(default_factory=dict,
                                     description="verifier settings (tolerance, tests, checks)")
    env: EnvKind = Field("single", description="environment kind")
    limits: TaskLimits = Field(default_factory=TaskLimits)
    split: Split = "train"
    tags: tuple[str, ...] = ()
    seed: int | None = Field(None, description="generator seed, if generated")
    key: str = Field("", description="stable id: '<domain>/<split>/<seed>' by default")

    @field_validator("files")
    @classmethod
    def _relative_paths(cls, files: dict[str, str]) -> dict[str, str]:
        for path in files:
            parts = path.split("/")
            if not path or path.startswith("/") or ".." in parts or "" in parts:
                raise ValueError(f"file path {path!r} must be relative, without '..' or empty parts")
        return files

    @model_validator(mode="after")
    def _default_key(self) -> Task:
        if not self.key:
            object.__setattr__(self, "key", f"{self.domain}/{self.split}/{self.seed}")
        # The hidden parts must be serialisable: they are hashed and stored.
        try:
            canonical_json(self.reference)
            canonical_json(self.verifier)
        except (TypeError, ValueError) as e:
            raise ValueError(f"task {self.key}: reference and verifier must be plain JSON: {e}") from e
        return self

    @cached_property
    def hash(self) -> str:
        """Content hash of everything that defines the task (not its key)."""
        return sha256_text(canonical_json(self.model_dump(mode="json", exclude={"key"})))

    @property
    def family(self) -> str:
        return self.domain.split(".", 1)[0]
