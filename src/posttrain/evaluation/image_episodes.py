"""The report's view of image episodes: a few stored trajectories that showed images, turn by
turn, each turn's images beside its observation and action (inline data URIs, so the HTML file
stays one self-contained file)."""

from __future__ import annotations

from typing import Any

OBSERVATION_CHARS = 1200
"""an observation longer than this is shown cut (the store has it whole)"""


def image_episodes(store: Any, limit: int = 6) -> list[dict[str, Any]]:
    """[{id, domain, status, reward, turns: [{index, observation, action, images: [{src, sha256}]}]}]"""
    out = []
    for traj_id in store.image_trajectory_ids(limit):
        t = store.get_trajectory(traj_id)
        turns = []
        for u in t.turns:
            obs = u.observation if len(u.observation) <= OBSERVATION_CHARS else (
                u.observation[:OBSERVATION_CHARS] + f"\n[... {len(u.observation) - OBSERVATION_CHARS} more characters]")
            turns.append({"index": u.index, "observation": obs, "action": u.action,
                          "images": [{"src": t.images[r["sha256"]].data_uri(), "sha256": r["sha256"]}
                                     for r in u.observation_images]})
        out.append({"id": t.id, "domain": t.domain, "status": t.status, "reward": t.reward, "turns": turns})
    return out
