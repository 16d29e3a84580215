"""Replay and re-score stored trajectories: what is compared, and how.

* **replay** (driven by the episode engine: `posttrain.scheduling.replay`): re-run a trajectory's
  actions in a fresh sandbox on the same task (looked up by its content hash), through the same
  `Episode` machinery, feeding back the stored completions (`_ReplayPolicy`: text and token
  counts, so context budgets decide the same way). Every observation (its text and the
  SHA-256 of every image it showed: a re-rendered chart or view must be byte-identical) and the
  verdict are compared; the first turn where they differ is reported. The sandbox runs the clock
  the episode recorded (`Trajectory.sandbox['clock']`: git's dates, `SOURCE_DATE_EPOCH`), so a
  commit hash made then is made again; a sandbox on another clock is reported, never compared.
  What cannot be pinned is said per trajectory (`timing_dependent`): an episode where a command
  hit its wall-clock or CPU limit depends on how loaded the machine was, and one that read the
  kernel's own clock (`date`, file times) sees today's. An episode whose context policy dropped
  observations (`Turn.dropped_observations`) drops the same ones at the same turns on replay;
  given the policy's tokenizer (`render`), every replayed prompt's ids are compared with the
  recorded ones too (the marker and the rebuilt prompt must come out the same).
* **rescore**: re-verify the stored outcome with the current verifier: the submitted answer, and
  for workspace tasks the final workspace restored from its stored archive. The new verdict is
  appended to the store (kind `rescore`); the original stays.
"""

from __future__ import annotations

import io
import tarfile
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, cast

from posttrain.envs import default_sandbox_factory, sandbox_preload
from posttrain.envs.single import SandboxFactory
from posttrain.envs.workspace import write_task_files
from posttrain.storage.store import Store
from posttrain.tasks.registry import get_domain
from posttrain.values.generation import (
    Completion,
    GenerationRequest,
    PolicyVersion,
)
from posttrain.values.trajectory import Trajectory, Turn
from posttrain.verifiers.base import Outcome, VerifierError, verify

if TYPE_CHECKING:
    from posttrain.sandbox.base import Sandbox


@dataclass
class ReplayResult:
    trajectory_id: str
    matched: bool
    divergence: dict[str, Any] | None = None
    """first difference: {'turn', 'field', 'stored', 'replayed'}"""
    verdict: dict[str, Any] = field(default_factory=dict)
    images: int = 0
    """images the replay re-rendered and found byte-identical (by SHA-256) to the stored ones"""
    timing: str | None = None
    """why this episode need not reproduce (`timing_dependent`); None when nothing in it did"""

    def to_dict(self) -> dict[str, Any]:
        return {"trajectory_id": self.trajectory_id, "matched": self.matched,
                "divergence": self.divergence, "verdict": self.verdict, "images": self.images,
                "timing": self.timing}


def timing_dependent(traj: Trajectory) -> str | None:
    """Why the recorded episode may not reproduce on replay, from its counters: a command that
    hit its wall-clock or CPU limit was cut at a point that depends on the machine's load then."""
    hits = {k.removeprefix("limit_"): n for k, n in traj.counters.items()
            if k in ("limit_timeout", "limit_cpu") and n}
    if not hits:
        return None
    return ("cut by a time limit (" + ", ".join(f"{n} command(s): {k}" for k, n in sorted(hits.items()))
            + "); where it was cut depends on the machine's load")


def recorded_clock(traj: Trajectory) -> int | None:
    """The fixed clock the episode's sandbox ran (None: the real clock); trajectories recorded
    before clocks were recorded ran the default one."""
    from posttrain.sandbox.base import DEFAULT_CLOCK

    return traj.sandbox.get("clock", DEFAULT_CLOCK)


def recorded_preload(traj: Trajectory) -> tuple[str, ...]:
    """What a sandbox replaying `traj` preloads: its domain's (module files its tools need
    among them, see `posttrain.envs.sandbox_preload`)."""
    return sandbox_preload([get_domain(traj.domain)])


class _ReplayPolicy:
    """Returns the stored completions of one trajectory, turn by turn."""

    def __init__(self, turns: Sequence[Turn], name: str, out_of_context: bool = False,
                 render: Callable[[GenerationRequest], list[int] | None] | None = None) -> None:
        self.turns = turns
        self.rendered: dict[int, list[int] | None] = {}
        """turn -> the replayed request's prompt ids, as `render` (the policy's tokenizer) makes them"""
        self._render = render
        self.version = PolicyVersion(name=name)
        self.max_positions: int | None = None
        """the recorded completions already carry the context's verdict (`out_of_context`)"""
        self.out_of_context = out_of_context
        """the episode ended because its next prompt did not fit the model's context"""
        self.accepts_images = True
        """images are re-rendered (and compared) whenever the recorded episode showed them"""

    def render(self, request: GenerationRequest) -> None:
        return None  # replays stored token ids; it has no tokenizer

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        out = []
        for req in requests:
            i = int(req.meta["turn"])
            if i >= len(self.turns) and self.out_of_context:
                out.append(Completion(text="", finish_reason="error", context_exceeded=True,
                                      error="replay: the recorded episode ran out of the model's context here"))
                continue
            if i >= len(self.turns):
                out.append(Completion(text="", finish_reason="stop"))
                continue
            t = self.turns[i]
            if self._render is not None:
                self.rendered[i] = self._render(req)
            finish = cast(Literal["stop", "length", "error"], t.finish_reason or "stop")
            out.append(Completion(text=t.action, finish_reason=finish,
                                  prompt_token_ids=t.prompt_token_ids, token_ids=t.token_ids,
                                  logprobs=t.logprobs))
        return out


class ReplayInfraError(RuntimeError):
    """The replay could not run (a sandbox, or a task's image that cannot be built again): no
    comparison was made."""


def _short(text: Any, n: int = 300) -> Any:
    return text if not isinstance(text, str) or len(text) <= n else text[:n] + f"... ({len(text)} chars)"


def _compare(traj: Trajectory, new: Trajectory, rendered: dict[int, list[int] | None] | None = None
             ) -> ReplayResult:
    """The first difference between the recorded episode and its replay (observations, images,
    tool outcomes, dropped observations, prompt ids when `rendered`, number of turns, verdict)."""
    images = 0
    a: object
    b: object
    rendered = rendered or {}
    for i, (old_t, new_t) in enumerate(zip(traj.turns, new.turns)):
        for fld in ("observation", "observation_images", "tool_results_ok", "dropped_observations",
                    "prompt_token_ids"):
            if fld == "observation":
                a, b = old_t.observation, new_t.observation
            elif fld == "dropped_observations":
                a, b = old_t.dropped_observations, new_t.dropped_observations
            elif fld == "prompt_token_ids":  # when both the recording and the tokenizer have them
                known = i in rendered and old_t.prompt_token_ids is not None and rendered[i] is not None
                a, b = (old_t.prompt_token_ids, rendered[i]) if known else (None, None)
            elif fld == "observation_images":
                old_h = [r["sha256"] for r in old_t.observation_images]
                new_h = [r["sha256"] for r in new_t.observation_images]
                images += len(old_h) if old_h == new_h else 0
                a, b = old_h, new_h
            else:
                a = [r.get("ok") for r in old_t.tool_results]
                b = [r.get("ok") for r in new_t.tool_results]
            if a != b:
                return ReplayResult(traj.id, False, {"turn": i, "field": fld, "stored": _short(a),
                                                     "replayed": _short(b)})
    if len(traj.turns) != len(new.turns):
        return ReplayResult(traj.id, False, {"turn": min(len(traj.turns), len(new.turns)),
                                             "field": "n_turns", "stored": len(traj.turns),
                                             "replayed": len(new.turns)})
    old_v, new_v = traj.verdict, new.verdict
    assert old_v is not None and new_v is not None
    summary = {"stored": {"passed": old_v.passed, "score": old_v.score},
               "replayed": {"passed": new_v.passed, "score": new_v.score}}
    if (old_v.passed, old_v.score, traj.status) != (new_v.passed, new_v.score, new.status):
        return ReplayResult(traj.id, False, {"turn": len(traj.turns), "field": "verdict",
                                             "stored": summary["stored"], "replayed": summary["replayed"]},
                            summary, images)
    return ReplayResult(traj.id, True, None, summary, images)


def submitted_answer(traj: Trajectory, env_kind: str) -> str | None:
    """The answer the episode submitted (None when it ended without one)."""
    if not traj.turns:
        return None
    if env_kind == "single":
        return traj.turns[-1].action
    for call in traj.turns[-1].tool_calls:
        if call.get("name") == "submit":
            return str(call.get("args", {}).get("answer", ""))
    return None


def restore_workspace(sandbox: Sandbox, archive: bytes) -> int:
    """Write a workspace archive into `sandbox` exactly: files with their bytes and modes
    (setuid/setgid included), directories (empty ones too), symbolic links; returns how many
    files. Entries come in the archive's order, parents first (`Workspace.archive`)."""
    n = 0
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        for member in tar.getmembers():
            name = member.name[2:] if member.name.startswith("./") else member.name
            if name in ("", "."):
                continue
            if member.isfile():
                data = tar.extractfile(member)
                assert data is not None
                sandbox.write_file(name, data.read(), mode=member.mode & 0o7777)
                n += 1
            elif member.isdir():
                sandbox.make_dir(name, member.mode & 0o7777)
            elif member.issym():
                sandbox.make_symlink(name, member.linkname)
    return n


def rescore(store: Store, traj: Trajectory, *, sandbox_factory: SandboxFactory | None = None,
            record: bool = True) -> ReplayResult:
    if traj.status == "infra_error" or traj.verdict is None:
        return ReplayResult(traj.id, False, {"turn": None, "field": "status",
                                             "stored": traj.status, "replayed": "not scorable"})
    domain = get_domain(traj.domain)
    task = store.get_task(traj.task_hash)
    answer = submitted_answer(traj, domain.env)
    with ExitStack() as stack:
        sandbox = None
        if domain.verifier.needs_sandbox:
            if sandbox_factory is None:
                sandbox_factory = default_sandbox_factory([domain])
            sandbox = stack.enter_context(sandbox_factory())
            if traj.final_workspace_sha256:
                restore_workspace(sandbox, store.get_blob(traj.final_workspace_sha256))
            else:
                write_task_files(sandbox, task)
        try:
            new_v = verify(domain.verifier, task, Outcome(answer=answer, sandbox=sandbox))
        except VerifierError as e:  # infrastructure (e.g. the task's image): nothing to compare
            raise ReplayInfraError(f"re-score of {traj.id} failed on infrastructure: {e}") from e
    if record:
        store.put_verdict(traj.id, new_v, "rescore")
    old_v = traj.verdict
    summary = {"stored": {"passed": old_v.passed, "score": old_v.score, "version": old_v.verifier_version},
               "rescored": {"passed": new_v.passed, "score": new_v.score, "version": new_v.verifier_version}}
    same = (old_v.passed, old_v.score) == (new_v.passed, new_v.score)
    div = None if same else {"turn": len(traj.turns), "field": "verdict", "stored": summary["stored"],
                             "replayed": summary["rescored"]}
    return ReplayResult(traj.id, same, div, summary)
