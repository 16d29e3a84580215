"""The main job's configuration: one TOML file, one small typed section per concern.

    name = "default"
    [model]      where the policy starts (a HF model dir or a checkpoint) and how it runs
    [domains]    what is trained, what is held out to watch for forgetting
    [rollout]    group size, batch, sampling
    [trainer]    the GRPO knobs: this section *is* `posttrain.training.TrainerConfig`
    [eval]       the before/after evaluation on the eval split: `posttrain.evaluation.EvalConfig`
    [scheduler]  the scheduler: `posttrain.scheduling.SchedulerConfig` (tiers, share_by, retries,
                 quarantine, adaptive sampling, batching), workers, backend, per-domain globs
    [logging]    experiment trackers (`posttrain.tracking.LoggingConfig`): TensorBoard by default

The trainer's, evaluation's and scheduler's sections are their own settings classes (with the
run's defaults), so there is one definition of every knob, documented where it is used, and one
validation (pydantic, `posttrain.settings`). Unknown keys are errors (a typo never silently falls
back to a default), and every error names the file and the dotted field, e.g. ``my.toml:
rollout.group_size: Input should be greater than or equal to 2``.
"""

from __future__ import annotations

import dataclasses
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from posttrain.evaluation.config import EvalConfig
from posttrain.scheduling.config import DomainSpec, SchedulerConfig
from posttrain.settings import check, error_lines, settings, to_data
from posttrain.tracking.config import LoggingConfig
from posttrain.training.config import TrainerConfig

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
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class ModelSection(_Section):
    path: str = Field(str(DEFAULT_MODEL), description="HF causal-LM or image-text-to-text directory, "
                                                      "or a posttrain checkpoint")
    device: str = Field("cpu", description="'cpu' or 'cuda' (or 'cuda:N')")
    threads: int = Field(2, ge=0, description="torch CPU threads; 0 = leave torch's default")


class DomainsSection(_Section):
    train: list[str] = Field(default_factory=lambda: list(DEFAULT_TRAIN),
                             description="domain globs trained on")
    heldout: list[str] = Field(default_factory=lambda: list(DEFAULT_HELDOUT),
                               description="domain globs never trained on (even where a `train` "
                                           "glob matches them), evaluated before and after to "
                                           "measure forgetting")
    weights: dict[str, float] = Field(default_factory=dict,
                                      description="domain -> sampling weight (default 1)")
    sources: list[str] = Field(default_factory=list,
                               description="task sources whose domains join the registry, e.g. "
                                           "'data:qa.jsonl' (posttrain.tasks.sources); when `train` is not "
                                           "given, their domains are what is trained")
    skip_unfit: bool = Field(False, description="leave out (and name once) the domains whose prompts "
                                                "do not fit the model's context, instead of refusing "
                                                "to start (`posttrain run --skip-unfit`)")
    quarantine: list[str] = Field(default_factory=list,
                                  description="run directories (or their quarantine.json) whose "
                                              "quarantined tasks (`posttrain tasks noise`) are never "
                                              "trained on; the run's own is always honoured")


class RolloutSection(_Section):
    group_size: int = Field(8, ge=2, description="samples per task (a GRPO group)")
    groups_per_step: int = Field(32, ge=1, description="groups per trainer step")
    signal_groups: int = Field(0, ge=0, description="dynamic sampling (DAPO): a step keeps taking "
                                                    "`groups_per_step` more groups until this many have a "
                                                    "reward spread (a group whose rewards are all equal gives "
                                                    "GRPO nothing), at most `max_takes` times; 0 = off")
    max_takes: int = Field(4, ge=1, description="the most takes of `groups_per_step` groups one step may make "
                                                "while looking for `signal_groups`")
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
    context: Literal["end", "drop_oldest_tool_output"] = Field(
        "end", description="when an episode's next prompt would not fit its context budget: 'end' it "
                           "(truncated), or 'drop_oldest_tool_output' (the oldest tool observations become "
                           "'[output dropped: N chars]', keeping the instruction and the last turns; "
                           "EnvConfig.context_policy)")
    mode: Literal["standard", "fast"] = Field(
        "standard", description="how the local sampling policy decodes: 'standard', or 'fast' (speculative "
                                "decoding verified by the model, same output distribution, and a prefix "
                                "cache across an episode's turns; posttrain.policies.local)")

    @model_validator(mode="after")
    def _mode_is_local(self) -> RolloutSection:
        # an inference server's speculative settings are the server's own (its launch flags)
        check(self.mode == "standard" or self.engine == "local", self, "mode",
              f"applies to engine = 'local' only; for {self.engine!r} set the server's speculative "
              "decoding options")
        return self


@settings
class EvalSection(EvalConfig):
    """`[eval]`: the evaluation before and after training (`EvalConfig`), with the run's defaults.

    `samples = N` is short for `k = [1, N]`. `max_tokens`, `seed` and `workers` default to the
    run's (`[rollout] max_tokens`, `seed`, `[scheduler] workers`)."""

    k: tuple[int, ...] = (1, 8)
    """pass@k values to report; every task is sampled max(k) times (`samples = N` sets [1, N])"""
    tasks_per_domain: int = 50
    """eval-split tasks per domain (seeds 0..N-1; a small domain that repeats a problem keeps it once)"""

    baseline: str | None = None
    """a baseline file (`posttrain eval baseline create`): after training, the trained policy is
    run on its frozen tasks, and the run exits 1 on a significant regression, as
    `posttrain eval --baseline` does (`evals/gate.json`, `summary.json` "gate")"""
    base_from: str | None = None
    """another run's directory whose evaluations of the same weights this run copies instead of
    drawing them again (its base evaluation, in an A/B of two training settings): the samples of
    the same tasks, drawn by the same policy with the same sampling settings and posttrain source,
    are reused; the rest are drawn (`posttrain.evaluation.reuse`). The figures are unchanged."""

    @model_validator(mode="before")
    @classmethod
    def _samples(cls, data: Any) -> Any:
        if isinstance(data, dict) and "samples" in data:
            data = dict(data)
            samples = data.pop("samples")
            if "k" in data:
                raise ValueError("give `samples` or `k`, not both")
            data["k"] = (1, samples) if isinstance(samples, int) and not isinstance(samples, bool) else samples
        return data

    @property
    def samples(self) -> int:
        """samples per task (the largest k)"""
        return self.n_samples


@settings
class DomainOverride:
    """Scheduler settings of the domains a glob matches (`[scheduler.domains."code.*"]`); a field
    left unset keeps its `DomainSpec` default. Later globs win where several match."""

    weight: float | None = None
    """share within its tier, relative to the other domains' weights (default 1, or `[domains] weights`)"""
    tier: str | None = None
    """priority tier, one of `[scheduler] tiers`"""
    max_concurrency: int | None = None
    """most episodes of each matched domain in flight at once (sandbox-hungry domains)"""
    max_sample_share: float | None = None
    """cap on each matched domain's share of its tier's samples over the sliding window"""
    max_cost_share: float | None = None
    """cap on each matched domain's share of its tier's cost over the sliding window"""
    group_size: int | None = None
    """episodes per group of each matched domain (default `[rollout] group_size`)"""
    max_samples: int | None = None
    """absolute budget of each matched domain: samples, after which it is retired for the run"""
    max_tokens: int | None = None
    """absolute budget of each matched domain: generated tokens, after which it is retired"""
    max_sandbox_s: float | None = None
    """absolute budget of each matched domain: sandbox worker-seconds, after which it is retired"""

    def given(self) -> dict[str, Any]:
        return {f: v for f, v in to_data(self).items() if v is not None}

    @model_validator(mode="after")
    def _rules(self) -> DomainOverride:
        DomainSpec("override", **self.given())  # the same value rules as the spec it changes
        return self


@settings
class SchedulerSection(SchedulerConfig):
    """`[scheduler]`: the scheduler's own settings (`SchedulerConfig`: tiers, `share_by`, window,
    starvation bound, `[scheduler.retry]`, `[scheduler.quarantine]`, `[scheduler.adaptive]`,
    `[scheduler.batch]`), where its episodes run, and per-domain overrides by glob.

    `group_size` and `groups_per_step` are `[rollout]`'s and `seed` the run's; `max_running` and
    `batch.max_batch` default to one step's episodes (at least 64)."""

    max_staleness: int | None = 0
    """policy versions a sample may lag (0 = synchronous; > 0 overlaps generation with training)"""
    workers: int = 2
    """environment workers: local threads (and warm sandboxes), or Ray actors"""
    backend: Literal["local", "ray"] = "local"
    """where episodes run: 'local' threads, or 'ray' actors (`max_running / workers` episodes each)"""
    address: str | None = None
    """the Ray cluster to join ('auto', 'ray://HOST:PORT'); None starts a local Ray"""
    domains: dict[str, DomainOverride] = field(default_factory=dict)
    """glob -> `DomainOverride` (weight, tier, max_concurrency, share caps, group_size)"""

    @model_validator(mode="after")
    def _section_rules(self) -> SchedulerSection:
        check(self.workers >= 1, self, "workers", "must be >= 1")
        check(self.address is None or self.backend == "ray", self, "address", "is only used with backend = 'ray'")
        for glob, o in self.domains.items():
            check(o.tier is None or o.tier in self.tiers, self, f"domains.{glob}.tier",
                  f"must be one of tiers {self.tiers}", o.tier)
        return self


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
    trainer: TrainerConfig = TrainerConfig()
    """the trainer (`TrainerConfig`, every field documented there); `run_name`, `seed`, `device`
    and `temperature` default to the run's `name`, `seed`, `[model] device` and `[rollout] temperature`"""
    eval: EvalSection = EvalSection()
    scheduler: SchedulerSection = SchedulerSection()
    logging: LoggingConfig = LoggingConfig()
    allow_contamination: bool = Field(False, description="start even if eval tasks leak into training")

    @model_validator(mode="wrap")
    @classmethod
    def _derive(cls, data: Any, handler: Any) -> RunConfig:
        """Fill the sections' run-wide fields from the run (what a section sets itself wins,
        except the rollout's group shape, which the scheduler must share)."""
        cfg = handler(data)
        if not isinstance(data, dict):
            return cfg
        given = {name: set(data[name]) if isinstance(data.get(name), dict) else set()
                 for name in ("trainer", "eval", "scheduler")}
        per_step = cfg.rollout.groups_per_step * cfg.rollout.group_size
        derived = {
            "trainer": {"run_name": cfg.name, "seed": cfg.seed, "device": cfg.model.device,
                        "temperature": cfg.rollout.temperature},
            "eval": {"max_tokens": cfg.rollout.max_tokens, "seed": cfg.seed, "workers": cfg.scheduler.workers},
            "scheduler": {"seed": cfg.seed, "max_running": max(64, per_step)},
        }
        for name in ("group_size", "groups_per_step"):
            mine, theirs = getattr(cfg.rollout, name), getattr(cfg.scheduler, name)
            if name in given["scheduler"] and theirs != mine:
                raise ValueError(f"scheduler.{name}: is [rollout] {name} ({mine}); set it there (got {theirs!r})")
            derived["scheduler"][name] = mine
        batch = (data.get("scheduler") or {}).get("batch")
        if not (isinstance(batch, dict) and "max_batch" in batch):
            # One step's episodes fit in one generate call: a CPU model runs a batch of 256
            # tiny prompts barely slower than a batch of 64.
            derived["scheduler"]["batch"] = dataclasses.replace(cfg.scheduler.batch, max_batch=max(64, per_step))
        update = {}
        for name, values in derived.items():
            values = {k: v for k, v in values.items() if k not in given[name] or k in ("group_size", "groups_per_step")}
            try:
                update[name] = dataclasses.replace(getattr(cfg, name), **values)
            except ValidationError as e:
                raise ValueError("\n".join(error_lines(e, prefix=(name,)))) from None
        return cfg.model_copy(update=update)

    @property
    def run_dir(self) -> Path:
        return Path(self.runs_dir) / self.name


class ConfigError(ValueError):
    """A config file that cannot be used; the message names the file and the field."""


def _format(source: str, e: ValidationError) -> str:
    return "\n".join(f"{source}: {line.removeprefix('(top level): ')}" for line in error_lines(e))


def parse_set(items: Iterable[str]) -> dict[tuple[str, ...], Any]:
    """`--set KEY=VALUE` overrides for `load_config`. KEY is a TOML dotted key into the run config
    (`trainer.lr`; a glob with dots quoted: `'scheduler.domains."code.*".weight'`), VALUE a TOML
    value (`4`, `1e-4`, `true`, `"text"`, `["math.*", "text.*"]`), else plain text
    (`openai:http://127.0.0.1:8000/v1#m`)."""
    out: dict[tuple[str, ...], Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        try:
            parsed = tomllib.loads(f"{key.strip()} = 0") if sep and key.strip() else None
        except tomllib.TOMLDecodeError:
            parsed = None
        if parsed is None:
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE with a dotted run-config key "
                              "(e.g. trainer.lr=1e-4)")
        parts: list[str] = []
        node: Any = parsed
        while isinstance(node, dict):
            (name, node), = node.items()
            parts.append(name)
        try:
            out[tuple(parts)] = tomllib.loads(f"v = {text}")["v"]
        except tomllib.TOMLDecodeError:
            out[tuple(parts)] = text
    return out


def dotted(flat: Mapping[str, Any]) -> dict[tuple[str, ...], Any]:
    """Dotted-string overrides (`{"trainer.lr": 1e-4}`) as key parts, to merge with `parse_set`'s
    (the two key kinds cannot share one typed mapping)."""
    return {tuple(k.split(".")): v for k, v in flat.items()}


def load_config(path: str | Path | None = None,
                overrides: Mapping[str, Any] | Mapping[tuple[str, ...], Any] | None = None) -> RunConfig:
    """The config from a TOML file (or the embedded default), with optional overrides: a dotted
    key (`"trainer.lr"`) or its parts (`("scheduler", "domains", "code.*", "weight")`, see
    `parse_set`) -> value."""
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
        *parents, leaf = parts = key.split(".") if isinstance(key, str) else key
        for i, p in enumerate(parents):
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(f"{source}: {'.'.join(parts[:i + 1])}: is a value, not a section "
                                  f"(cannot set {'.'.join(parts)})")
        node[leaf] = value
    try:
        return RunConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_format(source, e)) from None


RESUMABLE_CHANGES: tuple[str, ...] = ("steps", "checkpoint_every", "keep_checkpoints", "runs_dir",
                                      "model.threads", "eval.baseline", "eval.base_from", "logging")
"""what a `--resume` may change: how long the run trains (a larger `steps` trains a finished run
further), how often it saves and how many saves it keeps, the folder its directory was named from,
CPU threads, the baseline its result is gated against, the run whose evaluations it may reuse
(they are the ones it would draw), where its metrics are logged. Nothing else:
every other field shapes what the resumed steps do -- and a trainer setting would not even be
read, the checkpoint holds the trainer's own -- so a change is refused (`check_resume`) rather than
recorded in `config.json` as if it had taken effect."""


def run_started(run_dir: Path) -> bool:
    """A run exists once it has recorded something (its store or a checkpoint); a run refused
    before its first episode (contamination, a config the model cannot serve) may start again."""
    return (run_dir / "store.sqlite").exists() or (run_dir / "checkpoints").exists()


def _leaves(data: Any, prefix: str = "") -> dict[str, Any]:
    """'a.b.c' -> value of every non-dict value; an empty table has none (its entries say it all)"""
    if isinstance(data, dict):
        out: dict[str, Any] = {}
        for key, value in data.items():
            out.update(_leaves(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: data}


def resume_changes(recorded: Mapping[str, Any], config: RunConfig) -> list[str]:
    """The fields of `config` that differ from the `recorded` one (a run's `config.json`), outside
    `RESUMABLE_CHANGES`, as 'field: recorded -> now' lines. The recorded config is read through
    `RunConfig` first, so a field added to the project since the run started compares as its
    default; one that no longer validates is compared as written."""
    try:
        then = RunConfig.model_validate(dict(recorded)).model_dump(mode="json")
    except ValidationError:
        then = dict(recorded)
    before, now = _leaves(then), _leaves(config.model_dump(mode="json"))
    absent = "(absent)"
    out = []
    for key in sorted(set(before) | set(now)):
        if any(key == f or key.startswith(f + ".") for f in RESUMABLE_CHANGES):
            continue
        old, new = before.get(key, absent), now.get(key, absent)
        if old != new:
            out.append(f"{key}: {old!r} -> {new!r}")
    return out


def check_resume(config: RunConfig) -> None:
    """Refuse to continue a started run under settings other than those it recorded (see
    `RESUMABLE_CHANGES`): a resume continues exactly the run that was interrupted, or not at all."""
    import json

    run_dir = config.run_dir
    path = run_dir / "config.json"
    if not run_started(run_dir) or not path.is_file():
        return
    try:
        recorded = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path}: the run's recorded config is unreadable ({e})") from None
    if not isinstance(recorded, dict):
        raise ConfigError(f"{path}: the run's recorded config is not a JSON object")
    changes = resume_changes(recorded, config)
    if changes:
        raise ConfigError(
            f"{run_dir} was started with other settings; a resume must repeat them ({path}: "
            "recorded -> now):\n  " + "\n  ".join(changes) + "\nResume with the run's own config "
            f"(only {', '.join(RESUMABLE_CHANGES)} may change), or start a new run (--name NEW) "
            "from this one's checkpoint with --model.")
