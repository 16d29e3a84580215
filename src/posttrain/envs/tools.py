"""The multi-turn tool-use environment: the policy acts in a sandboxed workspace until it submits.

Each turn's text is parsed for tool calls (see `posttrain.envs.actions`), which run in order in
the episode's sandbox. Their results (cut to the context budget, visibly) are the next
observation. A malformed call, an unknown tool, a missing file or a failing command is reported
back to the policy and counted; the episode goes on. `<submit>` ends it (`terminated`); running out
of turns or time ends it as `truncated`. Either way, every process the episode left running is
killed and then the domain's verifier grades the workspace and the submitted answer.

Only a sandbox failure (`SandboxError`) or a verifier failure (`VerifierError`) escapes: those are
infrastructure errors, recorded as such by the episode runner.
"""

from __future__ import annotations

import json
import time
from contextlib import ExitStack
from typing import Any

from posttrain.envs.actions import BUILTIN_TOOLS, ToolCall, check_args, parse_action
from posttrain.envs.base import EpisodeEnd, Observation, StepResult
from posttrain.envs.budget import EnvConfig, truncate_text
from posttrain.envs.single import SandboxFactory
from posttrain.envs.vision import with_task_images
from posttrain.envs.workspace import write_task_files
from posttrain.images.episode import Image, image_for, task_sandbox
from posttrain.sandbox.base import RunResult, Sandbox, WorkspacePathError
from posttrain.tasks.domain import Domain, ToolOutput
from posttrain.values.image import Image as Picture  # `Image` here is a sandbox image
from posttrain.values.task import Task
from posttrain.verifiers.base import Outcome, verify

TOOLS_HELP = """Tools (write one or more calls; the last turn must be <submit>):
<bash>COMMAND</bash>  run a shell command in the workspace
<python>CODE</python>  run Python code in the workspace
<read path="PATH"/>  read a file
<write path="PATH">CONTENT</write>  create or overwrite a file
<edit path="PATH"><old>TEXT</old><new>TEXT</new></edit>  replace one occurrence
<submit>ANSWER</submit>  finish (ANSWER may be empty)"""

DEFAULT_STOP = ("</bash>", "</python>", "</write>", "</edit>", "</tool>", "</submit>", "</tool_call>")


def format_run(result: RunResult) -> str:
    head = f"exit {result.exit_code}" if result.limit is None else f"killed: {result.limit.value} limit"
    parts = [head]
    if result.stdout:
        parts.append(result.stdout.rstrip("\n") + ("\n[stdout cut]" if result.stdout_truncated else ""))
    if result.stderr:
        parts.append("[stderr]\n" + result.stderr.rstrip("\n")
                     + ("\n[stderr cut]" if result.stderr_truncated else ""))
    return "\n".join(parts)


def tools_intro(domain: Domain, task: Task) -> str:
    """The first observation of a tool-use episode: the prompt, the workspace's files, the tools."""
    help_text = TOOLS_HELP
    if domain.tools:
        help_text += "\n" + "\n".join(f'<tool name="{t.name}">ARGS</tool>  {t.description}'
                                      for t in domain.tools)
    listing = ""
    names = sorted([*task.files, *(p + "/" if e.kind == "dir" else p for p, e in task.entries.items())])
    if names:
        listing = "\nFiles in the workspace: " + ", ".join(names)
    return f"{task.prompt}{listing}\n\n{help_text}"


class ToolEnv:
    default_stop = DEFAULT_STOP

    def __init__(self, domain: Domain, config: EnvConfig = EnvConfig(),
                 sandbox_factory: SandboxFactory | None = None) -> None:
        if sandbox_factory is None:
            raise ValueError(f"domain {domain.name}: a tools environment needs a sandbox factory")
        self.domain = domain
        self.config = config
        self.sandbox_factory = sandbox_factory
        self.tools = {t.name: t for t in domain.tools}
        self.task: Task | None = None
        self.sandbox: Sandbox | None = None
        self._stack: ExitStack | None = None
        self.turns = 0
        self.started = 0.0
        self.timings: dict[str, float] = {}
        self.counters: dict[str, int] = {}
        self.sandbox_info: dict[str, Any] = {}
        self.image: Image | None = None

    # -- Gymnasium-style API -------------------------------------------------------------
    def reset(self, task: Task) -> Observation:
        self.close()
        self.task, self.turns, self.started = task, 0, time.monotonic()
        self._stack = ExitStack()
        self.image = image_for(task)  # a task with its own image (a Harbor Dockerfile) runs in it
        self.sandbox = self._stack.enter_context(
            task_sandbox(task) if self.image is not None else self.sandbox_factory())
        self.sandbox_info = {"backend": self.sandbox.info.backend, "image": self.sandbox.info.image,
                             "layers": dict(self.sandbox.info.layers), "clock": self.sandbox.info.clock}
        write_task_files(self.sandbox, task)
        return with_task_images(self.domain, task, Observation(tools_intro(self.domain, task)), self.config)

    def step(self, action: str) -> StepResult:
        task, sandbox = self.task, self.sandbox
        if task is None or sandbox is None:
            raise RuntimeError("step() before reset()")
        self.turns += 1
        t0 = time.perf_counter()
        parsed = parse_action(action)
        self._count("parse_errors", len(parsed.errors))
        outputs: list[str] = [f"[parse error] {e}" for e in parsed.errors]
        results: list[dict[str, Any]] = []
        images: list[Picture] = []
        submitted: str | None = None
        done = False
        if not parsed.calls and not parsed.errors:
            self._count("parse_errors")
            outputs.append("[parse error] no tool call found; use the tools listed above, "
                           "and <submit>ANSWER</submit> to finish")
        for call in parsed.calls:
            if call.name == "submit":
                submitted, done = str(call.args.get("answer", "")), True
                results.append({"name": "submit", "ok": True})
                break
            text, record, shown = self._run_tool(sandbox, call)
            outputs.append(text)
            images += shown
            results.append(record)
        self.timings["tool_s"] = self.timings.get("tool_s", 0.0) + time.perf_counter() - t0
        info = {"tool_calls": [c.to_dict() for c in parsed.calls], "tool_results": results,
                "parse_errors": parsed.errors}
        if self.config.snapshot_turns:
            info["snapshot_id"] = sandbox.snapshot()
        if done:
            return self._ended(self.finish(submitted, truncated=False), info)
        out_of_time = time.monotonic() - self.started > task.limits.time_s
        if self.turns >= task.limits.max_turns or out_of_time:
            self._count("time_limit" if out_of_time else "turn_limit")
            return self._ended(self.finish(None, truncated=True), info)
        text, cut = truncate_text("\n".join(outputs), self.config.observation_max_chars,
                                  self.config.truncate)
        if cut:
            self._count("observation_truncations")
        return StepResult(Observation(text, truncated_chars=cut, images=tuple(images)), reward=None, terminated=False,
                          truncated=False, info=info)

    @classmethod
    def needs_sandbox(cls, domain: Domain) -> bool:
        return True  # the workspace lives in it

    @classmethod
    def first_observation(cls, domain: Domain, task: Task, config: EnvConfig = EnvConfig()) -> str:
        return tools_intro(domain, task)

    @staticmethod
    def _ended(end: EpisodeEnd, info: dict[str, Any]) -> StepResult:
        return StepResult(Observation(""), reward=end.verdict.score, terminated=not end.truncated,
                          truncated=end.truncated, info=info, verdict=end.verdict, end=end)

    def finish(self, answer: str | None, truncated: bool) -> EpisodeEnd:
        """Kill leftover processes, grade, and end the episode."""
        assert self.task is not None and self.sandbox is not None
        t0 = time.perf_counter()
        killed = self.sandbox.kill_processes()
        if killed:
            self._count("processes_killed_before_grading", killed)
        verdict = verify(self.domain.verifier, self.task, Outcome(answer=answer, sandbox=self.sandbox))
        self.timings["verify_s"] = self.timings.get("verify_s", 0.0) + time.perf_counter() - t0
        return EpisodeEnd(verdict, truncated, workspace_archive=self.sandbox.archive())

    def close(self) -> None:
        if self._stack is not None:
            stack, self._stack, self.sandbox = self._stack, None, None
            stack.close()

    # -- tools ------------------------------------------------------------------------
    def _count(self, key: str, n: int = 1) -> None:
        if n:
            self.counters[key] = self.counters.get(key, 0) + n

    def _run_tool(self, sandbox: Sandbox, call: ToolCall) -> tuple[str, dict[str, Any], tuple[Picture, ...]]:
        """(observation text, record, images) for one call; tool failures are reported, not raised."""
        t0 = time.perf_counter()
        images: tuple[Picture, ...] = ()
        record: dict[str, Any] = {"name": call.name, "ok": False}
        task = self.task
        assert task is not None
        timeout = task.limits.command_timeout_s
        try:
            problem = check_args(call)
            if problem:
                raise ValueError(problem)
            if call.name == "bash":
                result = sandbox.run(call.args["command"], timeout=timeout)
                text, record = f"[bash] {format_run(result)}", self._run_record(call, result)
            elif call.name == "python":
                result = sandbox.run_python(call.args["code"], timeout=timeout)
                text, record = f"[python] {format_run(result)}", self._run_record(call, result)
            elif call.name == "read_file":
                data = sandbox.read_file(call.args["path"])
                text = f"[read {call.args['path']}]\n" + data.decode("utf-8", errors="replace")
                record.update(ok=True, bytes=len(data))
            elif call.name == "write_file":
                sandbox.write_file(call.args["path"], call.args["content"])
                text = f"[write {call.args['path']}] {len(call.args['content'])} characters written"
                record.update(ok=True)
            elif call.name == "edit_file":
                text = self._edit(sandbox, call.args["path"], call.args["old"], call.args["new"])
                record.update(ok=True)
            elif call.name in self.tools:
                args = call.args.get("input")
                if args is None or set(call.args) != {"input"}:
                    args = json.dumps(call.args)
                out = self.tools[call.name].run(sandbox, args)
                if isinstance(out, ToolOutput):
                    # a text-only policy gets the tool's words without its pictures
                    images = () if self.config.text_only else out.images
                    out = out.text
                text = f"[{call.name}]\n" + out
                record.update(ok=True)
                if images:
                    record["images"] = [img.sha256 for img in images]
            else:
                known = ", ".join(list(BUILTIN_TOOLS) + list(self.tools))
                raise ValueError(f"unknown tool {call.name!r} (tools: {known})")
        except (ValueError, WorkspacePathError, FileNotFoundError, IsADirectoryError,
                UnicodeDecodeError, PermissionError) as e:
            self._count("tool_errors")
            record["error"] = f"{type(e).__name__}: {e}"
            text = f"[{call.name} error] {e}"
        record["seconds"] = round(time.perf_counter() - t0, 6)
        return text, record, images

    def _run_record(self, call: ToolCall, result: RunResult) -> dict[str, Any]:
        if not result.ok:
            self._count("command_failures")
        if result.limit is not None:
            self._count(f"limit_{result.limit.value}")
        return {"name": call.name, "ok": result.ok, "exit_code": result.exit_code,
                "limit": result.limit.value if result.limit else None,
                "stdout_chars": len(result.stdout), "stderr_chars": len(result.stderr),
                "wall_s": result.wall_s}

    @staticmethod
    def _edit(sandbox: Sandbox, path: str, old: str, new: str) -> str:
        text = sandbox.read_file(path).decode("utf-8")
        count = text.count(old) if old else 0
        if count != 1:
            raise ValueError(f"<old> text must occur exactly once in {path}, found {count} times")
        sandbox.write_file(path, text.replace(old, new, 1))
        return f"[edit {path}] replaced 1 occurrence"
