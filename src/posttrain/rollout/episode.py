"""One episode as a small state machine, so that any driver can run it.

    ep = Episode(domain, task, policy_version="base", sampling=SamplingParams())
    request = ep.start()
    while request is not None:
        completion = policy.generate([request])[0]      # batched with other episodes' requests
        request = ep.advance(completion)               # env step: tools, then the verifier
    result = ep.result()        # EpisodeResult: the trajectory, the task, the final workspace

The engine (`posttrain.scheduling`) drives every episode this way. `advance` blocks on sandbox
I/O; the engine runs it off its event loop. Requests carry routing ids only (episode, group,
turn, domain, task key), never the task: a scripted policy is handed its script by the engine.

Context: when the next prompt would not fit the task's context budget, `EnvConfig.context_policy`
decides (`posttrain.envs.budget`): end the episode, or drop the oldest tool observations. A drop
breaks the token-in/token-out prefix, so that one prompt is rebuilt message by message
(`GenerationRequest.message_ids`): the model's actions as their sampled ids, the instruction and
the observations as recorded (an observation first shown in a prompt that itself dropped something
has no separately known ids and is rendered from its text, which gives the same ids under the plain
template), the markers rendered. The next turns extend that prompt again. Each turn records which
observations its prompt had dropped (`Turn.dropped_observations`), so a replay checks them.

Failure handling: a failed generation (`Completion.finish_reason == "error"`), a `SandboxError`, a
`VerifierError`, or any unexpected exception inside the environment ends the episode as
`infra_error` with the error recorded (type, message, traceback, where). It never becomes a reward
of 0, and it never escapes to crash the other episodes of a batch.
"""

from __future__ import annotations

import functools
import hashlib
import os
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace

from posttrain.envs import EnvConfig, Environment, EpisodeEnd, make_env, stop_strings
from posttrain.envs.budget import dropped_marker, plan_drops
from posttrain.envs.single import SandboxFactory
from posttrain.sandbox.base import SandboxError
from posttrain.tasks.domain import Domain
from posttrain.values.episode import EpisodeResult
from posttrain.values.generation import Completion, GenerationRequest, Message, SamplingParams
from posttrain.values.image import Image, parts
from posttrain.values.task import Task
from posttrain.values.trajectory import ErrorInfo, Status, Trajectory, Turn
from posttrain.values.verdict import Verdict
from posttrain.verifiers.base import VerifierError


def _where(exc: BaseException) -> str:
    if isinstance(exc, SandboxError):
        return "sandbox"
    if isinstance(exc, VerifierError):
        return "verifier"
    return "env"


class _EpisodeIds:
    """Random episode ids of 32 hex digits, as `uuid4().hex` gave (any prefix of one picks it
    out, as the store's and the CLI's short ids need), drawn from a per-process generator seeded
    by the OS: a uuid4 per episode cost a system call for randomness every time."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self._rng = random.Random(os.urandom(16))

    def new(self) -> str:
        return f"{self._rng.getrandbits(128):032x}"


_IDS = _EpisodeIds()
os.register_at_fork(after_in_child=_IDS.reset)  # a forked child must not repeat its parent's ids


@functools.lru_cache(maxsize=1024)
def _with_stop(sampling: SamplingParams, stop: tuple[str, ...]) -> SamplingParams:
    # cached: `replace` re-validates, and a workload's episodes share a few settings
    return replace(sampling, stop=stop)


@functools.lru_cache(maxsize=1024)
def _with_max_tokens(sampling: SamplingParams, max_tokens: int) -> SamplingParams:
    return replace(sampling, max_tokens=max_tokens)


class Episode:
    def __init__(self, domain: Domain, task: Task, *, policy_version: str,
                 sampling: SamplingParams = SamplingParams(), env_config: EnvConfig = EnvConfig(),
                 sandbox_factory: SandboxFactory | None = None, group_id: str = "",
                 attempt: int = 0, run_id: str = "", policy_staleness: int = 0,
                 tokenizer_hash: str = "", recorded_drops: Mapping[int, Sequence[int]] | None = None) -> None:
        """`recorded_drops`: a replay's turn -> the observations the recorded prompt had dropped
        (`Turn.dropped_observations`); the episode then drops exactly those instead of deciding."""
        self.domain, self.task = domain, task
        self.policy_version = policy_version
        stop = tuple(dict.fromkeys(sampling.stop + stop_strings(domain)))
        # the same frozen value when nothing changes
        self.sampling = sampling if stop == sampling.stop else _with_stop(sampling, stop)
        self.env_config = env_config
        self.sandbox_factory = sandbox_factory
        self.group_id, self.attempt, self.run_id = group_id, attempt, run_id
        self.policy_staleness = policy_staleness
        self.tokenizer_hash = tokenizer_hash
        self.id = _IDS.new()
        self.turns: list[Turn] = []
        self.messages: list[Message] = []
        self.counters: dict[str, int] = {}
        self.timings: dict[str, float] = {"gen_s": 0.0}
        self._observation = ""
        self._observation_cut = 0
        self._observation_images: tuple[Image, ...] = ()
        self.images: dict[str, Image] = {}  # every image shown, by sha256 (stored once each)
        self._context_used = 0  # tokens of the last request's prompt + its completion
        self._prefix: tuple[int, ...] | None = None  # token-in/token-out: the ids so far
        self._ids: list[tuple[int, ...] | None] = []  # each message's recorded ids (None: unknown)
        self._dropped: list[int] = []  # turns whose observation a marker replaced, in drop order
        self._sent: GenerationRequest | None = None  # the request the next completion answers
        self._recorded_drops = recorded_drops
        self._env: Environment | None = None
        self._started = 0.0
        self._result: EpisodeResult | None = None
        self._sandbox_info: dict[str, object] = {}

    # -- driver API -------------------------------------------------------------------
    def start(self) -> GenerationRequest | None:
        self._started = time.perf_counter()
        try:
            self._env = make_env(self.domain, self.env_config, self.sandbox_factory)
            obs = self._env.reset(self.task)
        except Exception as e:  # noqa: BLE001 - recorded as data, see module docstring
            self._infra(e, _where(e))
            return None
        self._observation, self._observation_cut = obs.text, obs.truncated_chars
        self._show(obs.images)
        self.messages.append(Message("user", parts(obs.text, obs.images)))
        return self._request()

    def advance(self, completion: Completion) -> GenerationRequest | None:
        if self._result is not None:
            raise RuntimeError(f"episode {self.id} already finished")
        self.timings["gen_s"] += completion.gen_s
        turn = Turn(index=len(self.turns), observation=self._observation, action=completion.text,
                    prompt_token_ids=completion.prompt_token_ids, token_ids=completion.token_ids,
                    logprobs=completion.logprobs, finish_reason=completion.finish_reason,
                    observation_truncated_chars=self._observation_cut, gen_s=completion.gen_s,
                    prefill_tokens=completion.prefill_tokens, reused_tokens=completion.reused_tokens,
                    dropped_observations=sorted(self._dropped),
                    observation_images=[img.ref() for img in self._observation_images])
        if completion.finish_reason == "error" and completion.context_exceeded and self.turns:
            # the conversation outgrew the model's context: the episode's budget is spent
            # (as when our own estimate says so in `_request`), not an infrastructure failure
            self._out_of_context()
            return None
        if completion.finish_reason == "error":
            self.turns.append(turn)
            # a first prompt that does not fit the model can never run: not the backend's fault
            self._infra(RuntimeError(completion.error or "generation failed"),
                        "context" if completion.context_exceeded else "policy")
            return None
        if completion.finish_reason == "length":
            self._count("length_cut")
        self._context_used = self._tokens_of(completion)
        t0 = time.perf_counter()
        assert self._env is not None
        try:
            step = self._env.step(completion.text)
        except Exception as e:  # noqa: BLE001
            self.turns.append(turn)
            self._infra(e, _where(e))
            return None
        turn.tool_s = time.perf_counter() - t0
        turn.tool_calls = step.info.get("tool_calls", [])
        turn.tool_results = step.info.get("tool_results", [])
        turn.parse_error = "; ".join(step.info.get("parse_errors", [])) or None
        turn.snapshot_id = step.info.get("snapshot_id")
        self.turns.append(turn)
        if step.end is not None:
            self._finish(step.end)
            return None
        self._show(step.observation.images)
        # token-in/token-out: the next prompt extends the ids sampled so far (no re-tokenizing)
        prompt_ids, new_ids = completion.prompt_token_ids, completion.token_ids
        self._prefix = None if prompt_ids is None or new_ids is None else tuple(prompt_ids) + tuple(new_ids)
        self._learn_ids(prompt_ids, new_ids)
        self.messages += [Message("assistant", completion.text),
                          Message("user", parts(step.observation.text, step.observation.images))]
        self._observation, self._observation_cut = step.observation.text, step.observation.truncated_chars
        return self._request()

    def result(self) -> EpisodeResult:
        if self._result is None:
            raise RuntimeError(f"episode {self.id} has not finished")
        return self._result

    @property
    def done(self) -> bool:
        return self._result is not None

    # -- internals --------------------------------------------------------------------
    def _show(self, images: tuple[Image, ...]) -> None:
        """The images of the observation about to be shown (recorded with the next turn)."""
        self._observation_images = images
        for img in images:
            self.images.setdefault(img.sha256, img)

    def _count(self, key: str, n: int = 1) -> None:
        self.counters[key] = self.counters.get(key, 0) + n

    def _tokens_of(self, completion: Completion) -> int:
        if completion.prompt_token_ids is not None and completion.token_ids is not None:
            return len(completion.prompt_token_ids) + len(completion.token_ids)
        chars = sum(len(m.text) for m in self.messages) + len(completion.text)
        return int(chars / self.env_config.chars_per_token) + 1

    def _out_of_context(self) -> None:
        """End the episode as truncated, graded on what it did: its context budget is spent."""
        self._count("context_budget_exhausted")
        assert self._env is not None
        try:
            end = self._env.finish(None, truncated=True)
        except Exception as e:  # noqa: BLE001
            self._infra(e, _where(e))
            return None
        self._finish(end)
        return None

    def _estimate(self, text: str) -> int:
        return int(len(text) / self.env_config.chars_per_token) + 1

    def _learn_ids(self, prompt_ids: list[int] | None, new_ids: list[int] | None) -> None:
        """Record the ids of the observation just shown (the part of the prompt after the ids
        sent) and of the action; then add a slot for the next observation's."""
        sent, last = self._sent, None
        if sent is not None and prompt_ids is not None:
            if len(self.messages) == 1:
                last = tuple(prompt_ids)
            elif sent.prefix_ids is not None and tuple(prompt_ids[:len(sent.prefix_ids)]) == sent.prefix_ids:
                last = tuple(prompt_ids[len(sent.prefix_ids):])
        self._ids += [None] * (len(self.messages) - len(self._ids))
        self._ids[-1] = last
        self._ids += [None if new_ids is None else tuple(new_ids), None]

    def _drop(self, remaining: int, forced: list[int] | None = None
              ) -> tuple[int, tuple[tuple[int, ...] | None, ...] | None]:
        """Apply the context policy 'drop_oldest_tool_output' when the prompt leaves less than a
        full turn's tokens (or drop the `forced` observations: a replay's recorded ones): returns
        the tokens saved and the rebuilt prompt's `message_ids`."""
        want = min(self.sampling.max_tokens, self.task.limits.max_tokens)
        texts = [t.observation for t in self.turns] + [self._observation]
        known = self._ids[::2]  # observation j is message 2j (the actions sit between them)
        sizes = [self._estimate(x) if ids is None else len(ids) for x, ids in zip(texts, known)]
        markers = [self._estimate(dropped_marker(x)) for x in texts]
        plan = forced if forced is not None else plan_drops(sizes, markers, self._dropped, want - remaining)
        if not plan:
            return 0, None
        for j in plan:
            self.messages[2 * j] = Message("user", dropped_marker(texts[j]))
            self._ids[2 * j] = None  # the marker is rendered by the policy
        self._dropped += plan
        self._count("context_dropped_observations", len(plan))
        saved = sum(sizes[j] - markers[j] for j in plan)
        if self._prefix is None:  # the policy gives no ids: it renders the messages
            return saved, None
        return saved, tuple(self._ids)  # the new observation's slot is None: rendered

    def _request(self) -> GenerationRequest | None:
        limits = self.task.limits
        pending = self._estimate(self._observation)
        prompt_tokens = self._context_used + pending if self.turns else pending
        remaining = limits.context_tokens - prompt_tokens
        message_ids = None
        if self._recorded_drops is not None:
            # an observation that does not exist (a corrupt record) is not dropped: the replay
            # then reports the difference instead of failing
            forced = sorted({j for j in self._recorded_drops.get(len(self.turns), ())
                             if 0 < j < len(self.turns)} - set(self._dropped))
            if forced:
                saved, message_ids = self._drop(remaining, forced)
                remaining += saved
        elif (self.env_config.context_policy == "drop_oldest_tool_output" and self.turns
                and remaining < min(self.sampling.max_tokens, limits.max_tokens)):
            saved, message_ids = self._drop(remaining)
            remaining += saved
        if remaining < 1:
            self._out_of_context()
            return None
        max_tokens = max(1, min(self.sampling.max_tokens, limits.max_tokens, remaining))
        sampling = self.sampling
        if max_tokens != sampling.max_tokens:
            sampling = _with_max_tokens(sampling, max_tokens)
        meta = {"episode": self.id, "domain": self.domain.name, "task_key": self.task.key,
                "turn": len(self.turns), "group_id": self.group_id}
        prefix = self._prefix if message_ids is None else None
        self._sent = GenerationRequest(messages=tuple(self.messages), sampling=sampling,
                                       request_id=f"{self.id}:{len(self.turns)}", meta=meta,
                                       prefix_ids=prefix, message_ids=message_ids,
                                       prefix_messages=len(self.messages) - 1 if prefix is not None else 0)
        return self._sent

    def _finish(self, end: EpisodeEnd) -> None:
        self._close_env()
        traj = self._trajectory("truncated" if end.truncated else "completed", verdict=end.verdict,
                                reward=end.verdict.score, archive=end.workspace_archive)
        self._result = EpisodeResult(traj, self.task, end.workspace_archive)
        return None

    def _infra(self, exc: BaseException, where: str) -> None:
        self._close_env()
        traj = self._trajectory("infra_error", error=ErrorInfo.from_exception(exc, where))
        self._result = EpisodeResult(traj, self.task, None)
        return None

    def _close_env(self) -> None:
        if self._env is not None:
            env, self._env = self._env, None
            self.counters.update(env.counters)
            self.timings.update(env.timings)
            self._sandbox_info = dict(env.sandbox_info)
            try:
                env.close()
            except Exception:  # noqa: BLE001 - a failed teardown must not hide the result
                self._count("close_errors")

    def _trajectory(self, status: Status, *, verdict: Verdict | None = None, reward: float | None = None,
                    error: ErrorInfo | None = None, archive: bytes | None = None) -> Trajectory:
        self.timings["total_s"] = time.perf_counter() - self._started
        archive_hash = hashlib.sha256(archive).hexdigest() if archive is not None else None
        return Trajectory(
            task_key=self.task.key, task_hash=self.task.hash, domain=self.domain.name,
            split=self.task.split, policy_version=self.policy_version, status=status,
            turns=self.turns, verdict=verdict, reward=reward, error=error,
            sampling=self.sampling.to_dict(), seed=self.task.seed, group_id=self.group_id,
            attempt=self.attempt, run_id=self.run_id, sandbox=self._sandbox_info,
            tokenizer_hash=self.tokenizer_hash,
            verifier_version=verdict.verifier_version if verdict else
            f"{self.domain.verifier.name}@{self.domain.verifier.version}",
            final_workspace_sha256=archive_hash, timings={k: round(v, 6) for k, v in self.timings.items()},
            counters=dict(self.counters), policy_staleness=self.policy_staleness, id=self.id,
            created_at=time.time(), images=dict(self.images))
