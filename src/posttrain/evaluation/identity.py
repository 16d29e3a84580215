"""What an evaluation records about who drew it, so that another run can tell whether the samples
are the ones it would draw itself (`posttrain.evaluation.reuse`)."""

from __future__ import annotations

import hashlib
from functools import cache
from pathlib import Path

from posttrain.values.generation import PolicyVersion


@cache
def source_fingerprint() -> str:
    """sha256 over the posttrain package's files (paths and contents; compiled files left out)."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        h.update(path.relative_to(root).as_posix().encode() + b"\0")
        h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


def identity(policy: PolicyVersion) -> dict[str, str]:
    """What `run_eval` records beside an evaluation's settings so another run can reuse it."""
    return {"policy": policy.name, "weights_hash": policy.weights_hash,
            "tokenizer_hash": policy.tokenizer_hash, "source": source_fingerprint()}
