"""A domain (task type): seeded generator + environment kind + verifier + oracle + negatives.

Families register many domains from parameters (see `posttrain.tasks.registry`). Every domain
must pass `posttrain tasks check`: its oracle passes, each of its negatives and of its
adversaries (`posttrain.tasks.adversaries`) fails, and verifying the same outcome twice agrees.

Actions are model text in the environment's action format (see `posttrain.envs`): for a
`single` environment one action, the answer itself; for a `tools` environment a list of turns,
each a tagged tool call (`<bash>...</bash>`, `<write path="f">...</write>`, `<submit>...</submit>`),
the last one ending the episode.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from posttrain.values.image import Image
from posttrain.values.task import EnvKind, Split, Task
from posttrain.verifiers.base import Verifier

if TYPE_CHECKING:
    from posttrain.sandbox.base import Sandbox

Actions = Sequence[str]


class NoTasksInSplit(ValueError):
    """Raised by a domain's `generate` for a split it has no tasks in (an imported single task,
    e.g. a Harbor task folder, lives in one split only). Tools that sample both splits may skip
    such (seed, split) pairs instead of counting a generator failure."""


@dataclass(frozen=True)
class ToolOutput:
    """What a tool that shows pictures returns: its text and the images after it."""

    text: str
    images: tuple[Image, ...] = ()


@dataclass(frozen=True)
class ToolSpec:
    """A domain tool, called as `<tool name="NAME">ARGS</tool>` (or an OpenAI function call)."""

    name: str
    description: str
    """one line shown to the policy in the tool list"""
    run: Callable[[Sandbox, str], str | ToolOutput]
    """(episode sandbox, raw argument text) -> observation text (or a `ToolOutput` with images);
    raise ValueError for bad args"""
    returns_images: bool = False
    """whether its output carries images (a text-only policy gets the `ToolOutput.text` only)"""


@dataclass(frozen=True)
class Domain:
    name: str
    """dotted name, '<family>.<...>', e.g. 'math.add.d2'"""
    family: str
    env: EnvKind
    verifier: Verifier
    generate: Callable[[int, Split], Task]
    """(seed, split) -> Task; the same arguments always give a byte-identical task"""
    oracle: Callable[[Task], Actions]
    """the reference solution as actions"""
    negatives: Callable[[Task], Mapping[str, Actions]]
    """named wrong attempts; must contain 'empty' and at least one plausible wrong answer"""
    description: str = ""
    adversaries: Callable[[Task], Mapping[str, Actions]] | None = None
    """named attempts that try to pass without solving the task (beside the library's generic
    ones in `posttrain.tasks.adversaries`); `tasks check` requires every one to fail"""
    tags: tuple[str, ...] = field(default=())
    tools: tuple[ToolSpec, ...] = field(default=())
    """extra tools of a `tools` environment, beside bash/python/read/write/edit/submit"""
    preload: tuple[str, ...] = field(default=())
    """modules the sandbox's warm interpreter imports up front (heavy libraries its tools or
    verifier use, e.g. ('numpy', 'manifold3d')): jobs then start without paying the import"""
    stop: tuple[str, ...] | None = None
    """stop strings of a policy turn; None = the environment's default ('\\n' for `single`
    answers, the closing tags of tool calls for `tools`). Use () for multi-line answers (code)."""

    images: Callable[[Task], tuple[Image, ...]] | None = None
    """images shown with the first observation, rendered from the task (same task -> the same
    bytes); None for a text domain"""
    text_fallback: Callable[[Task], str] | None = None
    """for a policy that reads no images: text that stands in for them (appended to the first
    observation; image tools then return their text only). None while the domain needs vision
    means a text-only policy is refused (`posttrain.envs.vision`)"""

    @property
    def needs_vision(self) -> bool:
        """Whether the domain shows images (first observation or tools)."""
        return self.images is not None or any(t.returns_images for t in self.tools)

    def __post_init__(self) -> None:
        if not self.name.startswith(self.family + "."):
            raise ValueError(f"domain {self.name!r} must start with its family {self.family!r}.")

    def task(self, seed: int, split: Split = "train") -> Task:
        task = self.generate(seed, split)
        if task.domain != self.name:
            raise ValueError(f"domain {self.name}: generator produced a task of domain {task.domain!r}")
        return task
