"""A `verifiers` environment as a posttrain domain: `--source verifiers:NAME[?ARG=VALUE&...]`.

`verifiers` (PrimeIntellect, the classic API of verifiers 0.1-0.2: `pip install 'posttrain[verifiers]'`)
packages an environment as a module with `load_environment(**args)`; `verifiers.load_environment(
NAME, **args)` imports it and returns an `Environment`: a dataset of rows (`prompt` messages,
`answer`, `info`), a `Rubric` of weighted reward functions and, for a `ToolEnv`, Python tools.
The source's query gives `load_environment` its arguments (values read as TOML would: numbers,
booleans, else text). The domain is `verifiers.<NAME>`:

* rows -> tasks. `get_dataset()` is the train split and `get_eval_dataset()` the eval split when
  the environment has one; with a train dataset only, rows split by a hash of their prompt as
  data sources do (`posttrain.tasks.sources.data.split_of`, 10% eval). The prompt messages become
  the task's text (the system prompt, then earlier turns as 'User:'/'Assistant:' lines, then the
  last user message); the whole row is the hidden reference.
* rubric -> verifier. The reward is the weighted sum of the rubric's reward functions, called the
  way verifiers calls them (by the names they ask for: prompt, completion, answer, info, state,
  parser, ...) on the completion as one assistant message. A reward that is not 0/1 passes when it
  reaches the environment's own `pass_threshold` (verifiers' attribute, default 0.5); the
  verdict's score is the reward clipped to [0, 1], and the raw reward and every function's value
  are in its details. Where verifiers scores a crashing reward function 0, here the exception is
  recorded: a failed verdict naming it (`failed_grading`: it ran on the policy's text).
* tools (`ToolEnv`) -> domain tools, called `<tool name="NAME">{"arg": ...}</tool>` (JSON
  arguments, as the function's signature names them); the answer is `<submit>...</submit>`.

Isolation: reward functions and tools are the environment's own Python. They run in the process
that hosts the episode (the scheduler's worker thread, or the Ray actor), not in the episode's
sandbox: trust an environment package as you trust any installed plugin. The policy's text reaches
them only as data (the completion string, JSON tool arguments).

Not supported (a `SourceError` naming the class): other `MultiTurnEnv`s (a custom `env_response`:
user simulators, games), `StatefulToolEnv` and sandboxed envs (`SandboxEnv`, `PythonEnv`), `EnvGroup`,
group reward functions (they score a whole group at once), and rubrics that call a model
(`JudgeRubric`: posttrain reaches no network). Reward functions that read the tool-call transcript
(`state['trajectory']`, tool messages in `completion`) see the final answer only.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import signal
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from posttrain.tasks.domain import Domain, NoTasksInSplit, ToolSpec
from posttrain.tasks.sources.data import split_of
from posttrain.values.task import Split, Task, TaskLimits, canonical_json
from posttrain.values.verdict import Verdict
from posttrain.verifiers.base import verdict

FAMILY = "verifiers"
EVAL_FRACTION = 0.1
DEFAULT_MAX_TOKENS = 256


class VerifiersSourceError(ValueError):
    """An environment that cannot be loaded or is of a kind this adapter does not support."""


_load_lock = threading.Lock()
_envs: dict[tuple[str, str], Any] = {}
"""(name, canonical args) -> the loaded environment: one load per process"""


def load_env(name: str, args: dict[str, Any]) -> Any:
    """`verifiers.load_environment(name, **args)`, once per process. verifiers installs SIGINT/SIGTERM
    handlers as it builds an environment; they would replace posttrain's own (a killed run records
    itself) and cannot be set off the main thread (a Ray actor), so the load sets none."""
    key = (name, canonical_json(args))
    with _load_lock:
        if key in _envs:
            return _envs[key]
        try:
            import verifiers
        except ImportError:
            raise VerifiersSourceError("verifiers:NAME needs the verifiers package: pip install "
                                       "'posttrain[verifiers]'") from None
        set_signal = signal.signal
        signal.signal = lambda *a, **k: None
        try:
            env = verifiers.load_environment(name, **args)
        except Exception as e:  # noqa: BLE001 - the environment's own code: report it by name
            raise VerifiersSourceError(f"verifiers:{name}: load_environment failed: "
                                       f"{type(e).__name__}: {e}") from None
        finally:
            signal.signal = set_signal
        _envs[key] = env
        return env


class EnvRef:
    """A loaded environment that pickles as its name and arguments (a Ray actor loads its own)."""

    def __init__(self, name: str, args: dict[str, Any]) -> None:
        self.name, self.args = name, dict(args)
        self.env = load_env(name, self.args)

    def __getstate__(self) -> dict[str, Any]:
        return {"name": self.name, "args": self.args}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.name, self.args = state["name"], state["args"]
        self.env = load_env(self.name, self.args)


def _run(value: Any) -> Any:
    """The value of a sync or async call, from any thread (an episode may already run a loop)."""
    if not inspect.isawaitable(value):
        return value

    async def wait() -> Any:
        return await value

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(wait())
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, wait()).result()


def _reward_functions(rubric: Any, where: str) -> list[tuple[Callable[..., Any], float, Any]]:
    """(function, weight, its rubric) of every reward function, through rubric groups."""
    import verifiers as vf

    if isinstance(rubric, vf.RubricGroup):
        return [f for r in rubric.rubrics for f in _reward_functions(r, where)]
    if isinstance(rubric, vf.JudgeRubric):
        raise VerifiersSourceError(f"{where}: {type(rubric).__name__} calls a judge model; not supported")
    out = []
    for func, weight in zip(rubric.funcs, rubric.weights):
        if rubric._is_group_func(func):
            raise VerifiersSourceError(f"{where}: reward function {func.__name__!r} scores a whole group; "
                                       "not supported (posttrain verifies each episode alone)")
        out.append((func, float(weight), rubric))
    return out


@dataclass(frozen=True)
class RubricVerifier:
    """The environment's rubric as a posttrain verifier (see the module docstring)."""

    ref: EnvRef
    name: str
    version: str = "1"
    needs_sandbox: bool = False

    def verify(self, task: Task, outcome: Any) -> Verdict:
        import verifiers as vf

        from posttrain.verifiers.base import GradingFailed, failed_grading

        env = self.ref.env
        row = task.reference["row"]
        answer = outcome.answer or ""
        state = vf.State()
        state.update(prompt=task.reference["prompt"], completion=[{"role": "assistant", "content": answer}],
                     answer=row.get("answer", ""), info=row.get("info") or {}, input=row,
                     example_id=row.get("example_id"))
        values: dict[str, float] = {}
        total = 0.0
        for func, weight, rubric in _reward_functions(env.rubric, f"verifiers:{self.ref.name}"):
            if weight == 0:  # a metric: it does not move the reward
                continue
            objects = rubric.score_objects(state)
            params = inspect.signature(func).parameters
            wants_all = any(p.kind == p.VAR_KEYWORD for p in params.values())
            kwargs = objects if wants_all else {k: v for k, v in objects.items() if k in params}
            try:
                value = float(_run(func(**kwargs)))
            except Exception as e:  # noqa: BLE001 - it ran on the policy's text: a failed verdict
                return failed_grading(self, GradingFailed(f"reward function {func.__name__!r}: "
                                                          f"{type(e).__name__}: {e}"), values=values)
            values[func.__name__] = value
            total += weight * value
        threshold = float(getattr(env, "pass_threshold", 0.5))
        return verdict(self, total >= threshold, min(1.0, max(0.0, total)), reward=total,
                       threshold=threshold, functions=values)


def _text(messages: Any, where: str) -> str:
    """The prompt messages as one text: system first, earlier turns as labelled lines, the last
    user message last."""
    if isinstance(messages, str):
        return messages
    if not isinstance(messages, list) or not messages:
        raise VerifiersSourceError(f"{where}: prompt: expected a list of messages, got {messages!r:.60}")
    parts = []
    for m in messages:
        content = m.get("content") if isinstance(m, dict) else None
        if not isinstance(content, str):
            raise VerifiersSourceError(f"{where}: prompt: only text messages are supported, got {m!r:.80}")
        role = m.get("role")
        last = m is messages[-1]
        parts.append(content if role == "system" or last else f"{str(role).capitalize()}: {content}")
    return "\n\n".join(parts)


def _tool(ref: EnvRef, name: str, description: str) -> ToolSpec:
    def run(sandbox: Any, args: str) -> str:
        try:
            kwargs = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as e:
            raise ValueError(f"tool {name}: arguments must be a JSON object: {e}") from None
        if not isinstance(kwargs, dict):
            raise ValueError(f"tool {name}: arguments must be a JSON object, got {args[:60]!r}")
        try:
            return str(_run(ref.env.tool_map[name](**kwargs)))
        except Exception as e:  # noqa: BLE001 - the tool's own error is the policy's observation
            raise ValueError(f"tool {name}: {type(e).__name__}: {e}") from None

    return ToolSpec(name=name, description=description, run=run)


def verifiers_domain(name: str, args: dict[str, Any]) -> Domain:
    """Load the environment and build its domain; raises VerifiersSourceError."""
    import verifiers as vf

    ref = EnvRef(name, args)
    env, where = ref.env, f"verifiers:{name}"
    unsupported = (vf.StatefulToolEnv, vf.EnvGroup, vf.SandboxEnv, vf.PythonEnv)
    if isinstance(env, unsupported) or not isinstance(env, (vf.SingleTurnEnv, vf.ToolEnv)):
        raise VerifiersSourceError(f"{where}: {type(env).__name__} is not supported (single-turn "
                                   "and ToolEnv environments are; see the README, 'Bring your own tasks')")
    tools = isinstance(env, vf.ToolEnv)
    funcs = _reward_functions(env.rubric, where)
    if not any(w for _, w, _ in funcs):
        raise VerifiersSourceError(f"{where}: the rubric has no weighted reward function")
    domain_name = f"{FAMILY}.{name.replace('/', '.')}"
    sampling = getattr(env, "sampling_args", {}) or {}
    limits = TaskLimits(max_tokens=int(sampling.get("max_tokens") or DEFAULT_MAX_TOKENS),
                        max_turns=int(getattr(env, "max_turns", 1) or 1) + (1 if tools else 0))
    tables: dict[str, list[Task]] = {"train": [], "eval": []}
    has_eval = env.eval_dataset is not None or getattr(env, "eval_dataset_source", None) is not None
    sets = [("train", env.get_dataset())] if env.dataset is not None or env.dataset_source else []
    if has_eval:
        sets.append(("eval", env.get_eval_dataset()))
    for given, dataset in sets:
        for n, row in enumerate(dataset):
            row_where = f"{where}: {given} row {n}"
            prompt = _text(row.get("prompt"), row_where)
            split: Split = given if has_eval else split_of(prompt, EVAL_FRACTION)  # type: ignore[assignment]
            try:
                task = Task(domain=domain_name, prompt=prompt, env="tools" if tools else "single",
                            reference={"prompt": row["prompt"], "row": row}, split=split, seed=len(tables[split]),
                            limits=limits, tags=(FAMILY,), key=f"{domain_name}/{split}/{given}{n}")
            except ValueError as e:
                raise VerifiersSourceError(f"{row_where}: {e}") from None
            tables[split].append(task)
    if not tables["train"] and not tables["eval"]:
        raise VerifiersSourceError(f"{where}: the environment's datasets have no rows")

    def generate(seed: int, split: Split) -> Task:
        table = tables[split]
        if not table:
            raise NoTasksInSplit(f"{domain_name}: no {split}-split rows")
        return table[seed % len(table)]

    def oracle(task: Task) -> list[str]:
        answer = str(task.reference["row"].get("answer", ""))
        return [f"<submit>{answer}</submit>"] if tools else [answer]

    def negatives(task: Task) -> dict[str, list[str]]:
        answer = str(task.reference["row"].get("answer", ""))
        table = tables[task.split]
        other = next((str(t.reference["row"].get("answer", "")) for t in table[1:] + table[:1]
                      if str(t.reference["row"].get("answer", "")).strip() not in ("", answer.strip())),
                     f"not {answer}")
        wrap = (lambda a: [f"<submit>{a}</submit>"]) if tools else (lambda a: [a])
        return {"empty": wrap(""), "other_row": wrap(other)}

    specs = tuple(_tool(ref, t.name, (t.description or t.name).splitlines()[0])
                  for t in (env.tool_defs or ())) if tools else ()
    return Domain(name=domain_name, family=FAMILY, env="tools" if tools else "single",
                  verifier=RubricVerifier(ref, name=f"verifiers.{name}"), generate=generate,
                  oracle=oracle, negatives=negatives, tools=specs, stop=() if not tools else None,
                  description=f"verifiers environment {name} ({type(env).__name__}): "
                              f"{len(tables['train'])} train / {len(tables['eval'])} eval rows",
                  tags=(FAMILY,))
