"""`EpisodeResult`: what one finished episode hands on, intact, to whoever consumes it.

The trajectory alone is not enough to store an episode: the store keeps the task it ran (so
nothing has to be regenerated from a seed, which an imported or file-defined task does not even
have) and the final workspace (so a sandboxed episode can be replayed from its final state). The
engine passes this one value from the episode driver to the trainer's groups, the store and the
evaluation records.
"""

from __future__ import annotations

from dataclasses import dataclass

from posttrain.values.task import Task
from posttrain.values.trajectory import Trajectory


@dataclass(frozen=True)
class EpisodeResult:
    trajectory: Trajectory
    task: Task | None
    """the task the episode ran; None only for simulated episodes (benchmarks, tests)"""
    workspace_archive: bytes | None = None
    """the final workspace as a tar archive (its sha256 is `trajectory.final_workspace_sha256`);
    None when the episode had no workspace or failed before its end"""
