"""`Task`: one problem instance, immutable, with a stable key and a content hash.

The `reference` (and anything under `verifier`) is hidden: environments show a policy only
`prompt` and the workspace's initial `files` (text) and `entries` (bytes with exact modes,
directories, symlinks: `FileEntry`). Trajectories record `key` and `hash` so a stored attempt can always be tied
back to exactly the task it was made on.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import posixpath
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


FileKind = Literal["file", "dir", "symlink"]
DEFAULT_MODES = {"file": 0o644, "dir": 0o755}


class FileEntry(BaseModel):
    """One workspace entry that plain text cannot carry: a file's exact bytes and mode
    (setuid, setgid and sticky bits included), a directory (an empty one too), or a symbolic
    link that stays inside the workspace.

    JSON: `{"kind": "file", "b64": "<base64 of the bytes>", "mode": 2541}`; `mode` also takes an
    octal string (`"4755"`) and defaults to 0644 for a file, 0755 for a directory. A link is
    `{"kind": "symlink", "target": "bin/tool"}` (relative: a task is placed anywhere)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: FileKind = "file"
    b64: str = Field("", description="a file's bytes, base64 (empty for a directory or link)")
    mode: int | None = Field(None, description="permission bits, 0..0o7777 (None for a link)")
    target: str = Field("", description="a link's target, relative to the link's directory")

    @field_validator("mode", mode="before")
    @classmethod
    def _octal(cls, mode: Any) -> Any:
        if isinstance(mode, str):
            try:
                return int(mode.removeprefix("0o"), 8)
            except ValueError:
                raise ValueError(f"mode {mode!r} is not an octal number like '0755'") from None
        return mode

    @model_validator(mode="after")
    def _consistent(self) -> FileEntry:
        if self.kind == "symlink":
            if self.mode is not None or self.b64:
                raise ValueError("a symlink has a target only (no mode, no b64)")
            if not self.target or "\0" in self.target:
                raise ValueError("a symlink needs a non-empty target")
            return self
        if self.target:
            raise ValueError(f"only a symlink has a target (this is a {self.kind})")
        if self.kind == "dir" and self.b64:
            raise ValueError("a directory has no b64 content")
        if self.mode is None:
            object.__setattr__(self, "mode", DEFAULT_MODES[self.kind])
        elif not 0 <= self.mode <= 0o7777:
            raise ValueError(f"mode {self.mode:#o} is outside 0..0o7777")
        try:
            base64.b64decode(self.b64, validate=True)
        except binascii.Error as e:
            raise ValueError(f"b64 is not base64: {e}") from None
        return self

    @property
    def data(self) -> bytes:
        return base64.b64decode(self.b64)

    @classmethod
    def file(cls, data: bytes | str, mode: int = 0o644) -> FileEntry:
        raw = data.encode() if isinstance(data, str) else data
        return cls(kind="file", b64=base64.b64encode(raw).decode("ascii"), mode=mode)

    @classmethod
    def directory(cls, mode: int = 0o755) -> FileEntry:
        return cls(kind="dir", mode=mode)

    @classmethod
    def symlink(cls, target: str) -> FileEntry:
        return cls(kind="symlink", target=target)


def check_workspace_path(path: str, entry: str | FileEntry | None = None) -> None:
    """A task's file path is relative, without '..' or empty parts; a symlink stays inside the
    task's files (it resolves within the workspace wherever the task is placed)."""
    parts = path.split("/")
    if not path or path.startswith("/") or ".." in parts or "" in parts:
        raise ValueError(f"file path {path!r} must be relative, without '..' or empty parts")
    if isinstance(entry, FileEntry) and entry.kind == "symlink":
        where = posixpath.normpath(posixpath.join(posixpath.dirname(path), entry.target))
        if entry.target.startswith("/") or where == ".." or where.startswith("../"):
            raise ValueError(f"symlink {path!r} -> {entry.target!r} leaves the task's files "
                             "(targets are relative and stay inside)")


class TaskLimits(BaseModel):
    """Budgets of one episode on this task."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

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
    entries: dict[str, FileEntry] = Field(
        default_factory=dict, description="initial workspace entries text cannot carry: binary "
        "files, exact modes, directories, symlinks (relative path -> FileEntry)")
    reference: Any = Field(None, description="hidden expected answer / solution data")
    verifier: dict[str, Any] = Field(default_factory=dict,
                                     description="verifier settings (tolerance, tests, checks)")
    env: EnvKind = Field("single", description="environment kind")
    limits: TaskLimits = Field(default_factory=TaskLimits)
    split: Split = "train"
    tags: tuple[str, ...] = ()
    seed: int | None = Field(None, description="generator seed, if generated")
    key: str = Field("", description="stable id: '<domain>/<split>/<seed>' by default")

    @field_validator("files", "entries")
    @classmethod
    def _relative_paths(cls, files: dict[str, Any]) -> dict[str, Any]:
        for path, entry in files.items():
            check_workspace_path(path, entry)
        return files

    @model_validator(mode="after")
    def _default_key(self) -> Task:
        both = sorted(set(self.files) & set(self.entries))
        if both:
            raise ValueError(f"paths {both[:3]} are in both files and entries")
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
        # no entries: the hash a task had before `entries` existed (stored runs still match)
        exclude = {"key"} | (set() if self.entries else {"entries"})
        return sha256_text(canonical_json(self.model_dump(mode="json", exclude=exclude)))

    def workspace(self) -> dict[str, FileEntry]:
        """Every initial workspace entry (text files as 0644 files), parents before children."""
        out = {path: FileEntry.file(text) for path, text in self.files.items()}
        out.update(self.entries)
        return dict(sorted(out.items(), key=lambda kv: kv[0].split("/")))

    @property
    def family(self) -> str:
        return self.domain.split(".", 1)[0]
