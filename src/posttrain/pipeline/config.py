"""The main job's configuration: one TOML file, one small typed section per concern.

    name = "default"
    [model]      where the policy starts (a HF model dir or a checkpoint) and how it runs
    [domains]    what is trained, what is held out to watch for forgetting
    [rollout]    group size, batch, sampling
    [trainer]    the GRPO knobs (`posttrain.training.TrainerConfig`; every field documented there)
    [eval]       the before/after evaluation on the eval split
    [scheduler]  staleness bound and worker counts
    [logging]    experiment trackers (`posttrain.tracking.LoggingConfig`): TensorBoard by default

Unknown keys are errors (a typo never silently falls back to a default), and every error names
the file and the dotted field, e.g. ``my.toml: rollout.group_size: Input should be greater than
or equal to 2``.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from posttrain.tracking.config import LoggingConfig

REPO_ROOT = Path(__file__).resolve().parents[3]
DEFAULT_MODEL = REPO_ROOT / "models" / "tiny-base"
DEFAULT_TRAIN: tuple[str, ...] = (
    "text.reverse.l3", "text.upper.l3", "text.lower.l3", "text.swapcase.l3", "text.double.l3",
    "text.sort.l3", "text.first.l5", "math.add.d1", "math.max.d1", "math.min.d1")
"""the default mix (10 domains): one domain of each op the shipped base model knows latently
(its pass@8 far above its pass@1, see models/README.md)"""
DEFAULT_HELDOUT: tuple[str, ...] = (
    "text.reverse.l5", "text.upper.l5", "text.lower.l5", "text.swapcase.l5", "text.last.l5",
    "text.vowels.l5", "math.max.d2", "math.min.d2")
"""in the pretraining corpus but never trained by RL (longer words and larger numbers of trained
ops, and ops not trained at all): their pass@1 before and after is the forgetting check"""


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelSection(_Section):
    path: str = Field(str(DEFAULT_MODEL), description="HF causal-LM directory or posttrain checkpoint")
    device: str = Field("cpu", description="'cpu' or 'cuda' (or 'cuda:N')")
    threads: int = Field(2, ge=0, description="torch CPU threads; 0 = leave torch's default")


class DomainsSection(_Section):
    train: list[str] = Field(default_factory=lambda: list(DEFAULT_TRAIN),
                             description="domain globs trained on")
    heldout: list[str] = Field(default_factory=lambda: list(DEFAULT_HELDOUT),
                               description="domain globs never trained on, evaluated before and "
                                           "after to measure forgetting")
    weights: dict[str, float] = Field(default_factory=dict,
                                      description="domain -> sampling weight (default 1)")
    sources: list[str] = Field(default_factory=list,
                               description="task sources whose domains join the registry, e.g. "
                                           "'data:qa.jsonl' (posttrain.tasks.sources); when `train` is not "
                                           "given, their domains are what is trained")


class RolloutSection(_Section):
    group_size: int = Field(8, ge=2, description="samples per task (a GRPO group)")
    groups_per_step: int = Field(32, ge=1, description="groups per trainer step")
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    max_tokens: int = Field(16, ge=1, description="new tokens per turn (domains may cap lower)")
    engine: str = Field("local", description="where training episodes are generated: 'local' (the trainer's "
                                             "process) or 'openai:URL[,URL...]#MODEL' (inference servers: vLLM "
                                             "with VLLM_SERVER_DEV_MODE=1 or posttrain.policies.serve; several "
                                             "URLs -> episodes sticky to one, least-loaded first)")
    sync: str = Field("reload", description="how a server gets each new version's weights: 'reload' "
                                            "(untied safetensors written atomically, then pause/reload/"
                                            "reset-prefix-cache/resume; posttrain.training.sync)")


class EvalSection(_Section):
    tasks_per_domain: int = Field(50, ge=1, description="eval-split tasks per domain")
    samples: int = Field(8, ge=1, description="samples per task (pass@1 and pass@k from them)")
    temperature: float = Field(1.0, ge=0, description="sampling temperature of the evaluation")


class SchedulerSection(_Section):
    workers: int = Field(2, ge=1, description="environment workers")
    max_staleness: int = Field(0, ge=0, description="policy versions a sample may lag (0 = synchronous)")


class RunConfig(_Section):
    name: str = Field("default", min_length=1, description="run name: the run directory is runs/<name>")
    runs_dir: str = Field("runs", description="parent of run directories")
    seed: int = 0
    steps: int = Field(200, ge=0, description="trainer steps of this round")
    checkpoint_every: int = Field(20, ge=1, description="trainer steps between checkpoints")
    keep_checkpoints: int = Field(3, ge=1, description="the newest checkpoints kept; older ones are "
                                                       "deleted (their policy versions stay recorded)")
    model: ModelSection = ModelSection()
    domains: DomainsSection = DomainsSection()
    rollout: RolloutSection = RolloutSection()
    trainer: dict[str, Any] = Field(default_factory=lambda: {"lr": 1e-4, "kl_beta": 0.0},
                                    description="TrainerConfig fields (validated by the trainer); "
                                                "the default is the recipe's (models/README.md)")
    eval: EvalSection = EvalSection()
    scheduler: SchedulerSection = SchedulerSection()
    logging: LoggingConfig = LoggingConfig()
    allow_contamination: bool = Field(False, description="start even if eval tasks leak into training")

    @property
    def run_dir(self) -> Path:
        return Path(self.runs_dir) / self.name


class ConfigError(ValueError):
    """A config file that cannot be used; the message names the file and the field."""


def _format(source: str, e: ValidationError) -> str:
    lines = []
    for err in e.errors():
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown field (check the spelling; see the documented fields)"
        lines.append(f"{source}: {where}: {msg}" + (f" (got {err['input']!r})"
                                                   if err["type"] != "extra_forbidden" and
                                                   not isinstance(err.get("input"), dict) else ""))
    return "\n".join(lines)


def load_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> RunConfig:
    """The config from a TOML file (or the embedded default), with optional overrides."""
    data: dict[str, Any] = {}
    source = "<default config>"
    if path is not None:
        source = str(path)
        try:
            data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"{source}: no such config file") from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"{source}: not valid TOML: {e}") from None
    for key, value in (overrides or {}).items():
        node = data
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    try:
        return RunConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_format(source, e)) from None
