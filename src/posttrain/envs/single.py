"""The single-answer environment: one policy turn, whose text is the answer.

Files of the task (documents, data) are shown inline after the prompt, capped by
`EnvConfig.show_files_in_prompt_chars` (a cut is marked and counted). When the domain's verifier
runs code (`needs_sandbox`), a sandbox is opened only for grading, with the task's files in it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack

from posttrain.envs.base import EpisodeEnd, Observation, StepResult
from posttrain.envs.budget import EnvConfig, truncate_text
from posttrain.envs.vision import with_task_images
from posttrain.envs.workspace import write_task_files
from posttrain.sandbox.base import Sandbox
from posttrain.tasks.domain import Domain
from posttrain.values.task import FileEntry, Task
from posttrain.verifiers.base import Outcome, verify

SandboxFactory = Callable[[], AbstractContextManager[Sandbox]]


def render_files(task: Task, max_chars: int) -> tuple[str, int]:
    """The task's files as text blocks after the prompt; (text, characters cut)."""
    if not task.files and not task.entries:
        return "", 0
    blocks = [f"--- {path} ---\n{content.rstrip()}" for path, content in sorted(task.files.items())]
    blocks += [f"--- {path} ({_describe(e)}) ---" for path, e in sorted(task.entries.items())]
    return truncate_text("\n\n" + "\n\n".join(blocks), max_chars, "head")


def _describe(entry: FileEntry) -> str:
    if entry.kind == "symlink":
        return f"symlink to {entry.target}"
    mode = f"mode {entry.mode or 0:04o}"
    return f"directory, {mode}" if entry.kind == "dir" else f"{len(entry.data)} bytes, {mode}"


class SingleAnswerEnv:
    """`reset` shows the prompt; the first `step` is the answer and ends the episode."""

    default_stop: tuple[str, ...] = ("\n",)

    def __init__(self, domain: Domain, config: EnvConfig = EnvConfig(),
                 sandbox_factory: SandboxFactory | None = None) -> None:
        self.domain = domain
        self.config = config
        self.sandbox_factory = sandbox_factory
        self.task: Task | None = None
        self.timings: dict[str, float] = {}
        self.counters: dict[str, int] = {}
        self.sandbox_info: dict = {}

    def reset(self, task: Task) -> Observation:
        self.task = task
        files, cut = render_files(task, self.config.show_files_in_prompt_chars)
        if cut:
            self.counters["observation_truncations"] = self.counters.get("observation_truncations", 0) + 1
        return with_task_images(self.domain, task, Observation(task.prompt + files, truncated_chars=cut),
                                self.config)

    def step(self, action: str) -> StepResult:
        if self.task is None:
            raise RuntimeError("step() before reset()")
        end = self.finish(action, truncated=False)
        return StepResult(Observation(""), reward=end.verdict.score, terminated=True, truncated=False,
                          info={}, verdict=end.verdict, end=end)

    @classmethod
    def needs_sandbox(cls, domain: Domain) -> bool:
        """Only to grade, and only when the verifier runs code."""
        return domain.verifier.needs_sandbox

    @classmethod
    def first_observation(cls, domain: Domain, task: Task, config: EnvConfig = EnvConfig()) -> str:
        files, _ = render_files(task, config.show_files_in_prompt_chars)
        return task.prompt + files

    def finish(self, answer: str | None, truncated: bool) -> EpisodeEnd:
        """Grade `answer` and end the episode (also used when a budget ran out)."""
        task = self.task
        assert task is not None
        t0 = time.perf_counter()
        with ExitStack() as stack:
            sandbox = None
            if self.domain.verifier.needs_sandbox:
                if self.sandbox_factory is None:
                    raise RuntimeError(f"domain {self.domain.name} needs a sandbox to verify, "
                                       "but the environment was given no sandbox factory")
                sandbox = stack.enter_context(self.sandbox_factory())
                self.sandbox_info = {"backend": sandbox.info.backend, "image": sandbox.info.image,
                                     "clock": sandbox.info.clock}
                write_task_files(sandbox, task)
            verdict = verify(self.domain.verifier, task, Outcome(answer=answer, sandbox=sandbox))
        self.timings["verify_s"] = self.timings.get("verify_s", 0.0) + time.perf_counter() - t0
        return EpisodeEnd(verdict, truncated)

    def close(self) -> None:
        self.task = None
