"""The run config's sections are the trainer's, scheduler's and evaluation's own settings classes,
validated one way; per-domain scheduler overrides by glob; quarantined tasks are never drawn."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from posttrain.evaluation.config import EvalConfig
from posttrain.pipeline import checks, mix
from posttrain.pipeline.config import (
    ConfigError,
    DomainOverride,
    EvalSection,
    RunConfig,
    SchedulerSection,
    load_config,
    parse_set,
)
from posttrain.scheduling.config import (
    AdaptiveConfig,
    BatchConfig,
    DomainSpec,
    QuarantineConfig,
    RetryConfig,
    SchedulerConfig,
)
from posttrain.settings import describe_fields
from posttrain.tasks.registry import get_domain
from posttrain.training.config import TrainerConfig
from posttrain.values.task import TaskLimits

ROOT = Path(__file__).resolve().parents[1]

SETTINGS_CLASSES = [TrainerConfig, SchedulerConfig, RetryConfig, QuarantineConfig, AdaptiveConfig,
                    BatchConfig, DomainSpec, EvalConfig, EvalSection, SchedulerSection, DomainOverride]


@pytest.mark.parametrize("cls", SETTINGS_CLASSES, ids=lambda c: c.__name__)
def test_every_field_is_documented(cls):
    undocumented = [name for name, doc in describe_fields(cls).items() if not doc.strip()]
    # a subclass that only changes a default inherits the meaning: its parent documents it
    parents = [p for p in cls.__mro__[1:] if p in SETTINGS_CLASSES]
    undocumented = [n for n in undocumented if not any(describe_fields(p).get(n) for p in parents)]
    assert not undocumented, f"{cls.__name__}: fields without a docstring: {undocumented}"


def test_sections_are_the_settings_classes_with_the_runs_defaults(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('name = "r"\nseed = 7\n[model]\ndevice = "cpu"\n[rollout]\ngroup_size = 4\n'
                    'groups_per_step = 3\ntemperature = 0.9\nmax_tokens = 12\n'
                    '[trainer]\nlr = 2e-4\nseed = 1\n[eval]\nsamples = 4\n'
                    '[scheduler]\nworkers = 3\nmax_staleness = 1\nshare_by = "cost"\n'
                    'tiers = ["train"]\n[scheduler.retry]\nmax_retries = 5\n')
    cfg = load_config(path)
    assert isinstance(cfg.trainer, TrainerConfig) and isinstance(cfg.eval, EvalConfig)
    assert isinstance(cfg.scheduler, SchedulerConfig)
    # run-wide values fill what a section leaves unset; what it sets wins
    assert (cfg.trainer.lr, cfg.trainer.seed, cfg.trainer.run_name, cfg.trainer.temperature) == (2e-4, 1, "r", 0.9)
    assert cfg.eval.k == (1, 4) and cfg.eval.samples == 4 and cfg.eval.max_tokens == 12
    assert (cfg.eval.seed, cfg.eval.workers, cfg.eval.tasks_per_domain) == (7, 3, 50)
    s = cfg.scheduler
    assert (s.group_size, s.groups_per_step, s.seed, s.max_staleness) == (4, 3, 7, 1)
    assert (s.share_by, s.tiers, s.retry.max_retries, s.max_running, s.batch.max_batch) == \
        ("cost", ("train",), 5, 64, 64)
    # the evaluation records only its own fields, and reloads from them
    assert EvalConfig.from_dict(cfg.eval.to_dict()) == EvalConfig(**cfg.eval.to_dict())
    # config.json (the resolved config) loads back to the same config
    again = RunConfig.model_validate(json.loads(json.dumps(cfg.model_dump(mode="json"))))
    assert again == cfg


def test_the_group_shape_belongs_to_the_rollout_section():
    with pytest.raises(ConfigError, match=r"scheduler.group_size: is \[rollout\] group_size \(8\)"):
        load_config(None, {"scheduler.group_size": 4})
    assert load_config(None, {"scheduler.group_size": 8}).scheduler.group_size == 8
    big = load_config(None, {"rollout.groups_per_step": 40})  # one step's 320 episodes in one batch
    assert big.scheduler.max_running == 320 and big.scheduler.batch.max_batch == 320
    assert load_config(None, {"scheduler.batch": {"max_batch": 16}}).scheduler.batch.max_batch == 16


@pytest.mark.parametrize("override,fragment", [
    ({"scheduler.backend": "slurm"}, "scheduler.backend: Input should be 'local' or 'ray'"),
    ({"scheduler.address": "auto"}, "scheduler.address: is only used with backend = 'ray'"),
    ({"scheduler.adaptive": {"floor": 0}}, "scheduler.adaptive.floor: must be in (0, 1] (got 0.0)"),
    ({"scheduler.domains": {"code.*": {"max_concurrency": 0}}},
     "scheduler.domains.code.*.max_concurrency: must be >= 1 or None (got 0)"),
    ({"scheduler.domains": {"code.*": {"weigth": 2}}}, "scheduler.domains.code.*.weigth: unknown field"),
    ({"eval.confidence": 2}, "eval.confidence: must be in (0, 1)"),
    ({"trainer.loss_agg": "mean"}, "trainer.loss_agg: Input should be 'token' or 'sequence'"),
    ({"rollout.mode": "turbo"}, "rollout.mode: Input should be 'standard' or 'fast' (got 'turbo')"),
    ({"rollout.mode": "fast", "rollout.engine": "openai:http://127.0.0.1:9/v1#m"},
     "rollout.mode: applies to engine = 'local' only"),
])
def test_errors_name_the_field(override, fragment):
    with pytest.raises(ConfigError) as e:
        load_config(None, override)
    assert str(e.value).startswith("<default config>: ") and fragment in str(e.value), str(e.value)


def test_domain_overrides_by_glob_later_globs_win():
    cfg = load_config(None, {"domains.weights": {"math.add.d1": 3.0},
                             "scheduler.domains": {"math.*": {"max_concurrency": 2, "weight": 2.0},
                                                   "math.add.*": {"tier": "background"}}})
    domains = [get_domain(n) for n in ("math.add.d1", "math.max.d1", "text.upper.l3")]
    specs = {s.name: s for s in mix.domain_specs(cfg, domains)}
    light = {"light": True}  # in-process domains: no sandbox (set from the domain, not the config)
    assert specs["math.add.d1"] == DomainSpec("math.add.d1", weight=2.0, max_concurrency=2, tier="background", **light)
    assert specs["math.max.d1"] == DomainSpec("math.max.d1", weight=2.0, max_concurrency=2, **light)
    assert specs["text.upper.l3"] == DomainSpec("text.upper.l3", **light)
    code = mix.domain_specs(cfg, [get_domain("code.list.chunk")] + domains)[0]
    assert code.sandboxed and not code.light
    typo = load_config(None, {"scheduler.domains": {"maths.*": {"weight": 2.0}}})
    with pytest.raises(ConfigError, match="'maths.\\*' match\\(es\\) no trained domain"):
        mix.domain_specs(typo, domains)


def test_quarantined_tasks_are_never_drawn_and_the_draw_stays_seeded(tmp_path):
    from posttrain.evaluation.noise import QUARANTINE_FILE, QUARANTINE_FORMAT

    d = get_domain("math.add.d2")
    bad = {d.task(s, "train").hash for s in range(0, 40, 2)}  # every even seed's task
    run = tmp_path / "noisy"
    run.mkdir()
    (run / QUARANTINE_FILE).write_text(json.dumps({"format": QUARANTINE_FORMAT,
                                                   "tasks": {h: {"reason": "flips"} for h in bad}}))
    cfg = load_config(None, {"runs_dir": str(tmp_path), "name": "r", "domains.quarantine": [str(run)]})
    hashes = mix.load_quarantines(mix.quarantine_dirs(cfg))
    assert hashes == bad
    [wrapped] = mix.without_quarantined([d], hashes)
    drawn = [wrapped.task(s, "train") for s in range(40)]
    assert not {t.hash for t in drawn} & bad
    assert [t.hash for t in drawn[1::2]] == [d.task(s, "train").hash for s in range(1, 40, 2)]
    assert [t.hash for t in drawn] == [wrapped.task(s, "train").hash for s in range(40)]
    assert wrapped.generate.skipped >= 20
    with pytest.raises(ConfigError, match="no quarantine.json there"):
        mix.quarantine_dirs(load_config(None, {"domains.quarantine": [str(tmp_path / "none")]}))


@pytest.mark.slow
def test_train_star_selects_every_domain_with_a_train_split_except_the_held_out(tmp_path):
    from rich.console import Console

    from posttrain.pipeline.main import Job
    from posttrain.tasks.registry import match_domains

    cfg = load_config(ROOT / "configs" / "breadth.toml", {"runs_dir": str(tmp_path)})
    job = Job(cfg, Console(quiet=True))
    trained = {d.name for d in job.train_domains}
    held = {d.name for d in job.heldout_domains}
    assert held == set(cfg.domains.heldout) and not trained & held
    assert len(trained) + len(held) >= 300 and {d.split(".")[0] for d in trained} >= \
        {"math", "text", "code", "terminal", "geometry", "docs", "rg"}
    assert trained == {d.name for d in match_domains(["*"])
                       if d.name not in held and checks.has_split(d, "train")}


def test_rollout_mode_defaults_to_standard_and_parses_fast(tmp_path):
    assert load_config(None).rollout.mode == "standard"
    path = tmp_path / "fast.toml"
    path.write_text('[rollout]\nmode = "fast"\n')
    assert load_config(path).rollout.mode == "fast"


def test_a_concurrency_limit_below_a_domains_share_of_a_step_is_warned_and_real():
    """13 domains limited to 4 episodes in flight cannot fill a step of 16 groups of 8 at their
    weights: the scheduler fills it from whatever domain can go, so a domain weighted 0.1 got a
    group every step. The warning names that case, and stays quiet where the limits hold."""
    from posttrain.scheduling import SchedulerCore
    from posttrain.scheduling.work import Usage
    from posttrain.values.episode import EpisodeResult
    from posttrain.values.trajectory import Trajectory

    names = ["math.add.d1", "math.div.d1", "math.gcd.d1", "math.max.d1", "math.min.d1"]
    domains = [get_domain(n) for n in names]
    rare_groups = {}
    for limit in (4, 16):
        cfg = load_config(None, {"rollout.groups_per_step": 8, "rollout.group_size": 8,
                                 "domains.weights": {"math.add.d1": 0.1},
                                 "scheduler.domains": {"math.*": {"max_concurrency": limit}}})
        specs = mix.domain_specs(cfg, domains)
        warnings = mix.concurrency_warnings(cfg, specs)
        if limit == 4:  # 1.95 groups a step wanted by each heavy domain, 1 held at a time
            (w,) = warnings
            assert "4 domain(s)" in w and "weight share 1.95 of the 8 groups" in w
            assert "max_concurrency = 4 holds 1 group(s) of 8" in w and "at least 16" in w
        else:
            assert warnings == []
        core = SchedulerCore(SchedulerConfig(group_size=8, groups_per_step=8, max_running=64, max_staleness=0,
                                             starvation_s=None, seed=0, adaptive=AdaptiveConfig(enabled=False)),
                             specs, clock=lambda: 0.0)
        taken = []
        for step in range(10):
            while running := list(iter(core.next_episode, None)):
                for spec in running:
                    traj = Trajectory(task_key="k", task_hash="h", domain=spec.domain, split="train",
                                      policy_version="v", status="completed", reward=1.0)
                    core.episode_finished(spec, EpisodeResult(traj, None), Usage())
            taken += core.take(8)
            core.set_version(f"step-{step + 1}")
        rare_groups[limit] = sum(g.domain == "math.add.d1" for g in taken)
    # its quota is 0.1 / 4.1 of 80 groups = ~2
    assert rare_groups[4] >= 8 and rare_groups[16] <= 3, rare_groups


def test_set_overrides_are_toml_keys_and_values():
    sets = parse_set(["trainer.replay_solved=4", "trainer.lr = 1e-4", "domains.train=[\"math.*\", \"text.*\"]",
                      'scheduler.domains."math.*".max_concurrency=16', "rollout.engine=openai:http://127.0.0.1:9/v1#m",
                      "scheduler.starvation_s=60.5", "allow_contamination=true"])
    assert sets[("scheduler", "domains", "math.*", "max_concurrency")] == 16
    assert sets[("rollout", "engine")] == "openai:http://127.0.0.1:9/v1#m"  # not TOML: plain text
    cfg = load_config(None, {**sets, ("steps",): 3})
    assert (cfg.trainer.replay_solved, cfg.trainer.lr, cfg.steps) == (4, 1e-4, 3)
    assert cfg.domains.train == ["math.*", "text.*"] and cfg.allow_contamination is True
    assert cfg.scheduler.domains["math.*"].max_concurrency == 16 and cfg.scheduler.starvation_s == 60.5
    for bad in ("trainer.lr", "=3", "trainer..lr=3", "a b=1"):
        with pytest.raises(ConfigError, match=f"--set '{re.escape(bad)}': expected KEY=VALUE"):
            parse_set([bad])
    with pytest.raises(ConfigError, match=r"<default config>: steps: is a value, not a section \(cannot set steps.x\)"):
        load_config(None, {("steps",): 3, **parse_set(["steps.x=1"])})
    with pytest.raises(ConfigError, match="trainer.lr: must be > 0"):
        load_config(None, parse_set(["trainer.lr=-1"]))


def _float_leaves(data, prefix=()):
    if isinstance(data, dict):
        for key, value in data.items():
            yield from _float_leaves(value, (*prefix, key))
    elif isinstance(data, float):
        yield prefix


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan")], ids=["inf", "-inf", "nan"])
def test_no_setting_takes_a_non_finite_number(value):
    """Every float of the run config (the defaults' float leaves, and floats whose default is None)
    refuses inf and nan, naming the field: `lr = inf` would train nan weights and record
    `Infinity` in config.json, and a field without a range rule took nan."""
    keys = [tuple(k) for k in _float_leaves(load_config(None).model_dump())]
    keys += [("scheduler", "retry", "episode_timeout_s"), ("scheduler", "domains", "code.*", "max_sample_share"),
             ("scheduler", "domains", "code.*", "max_sandbox_s")]
    assert len(keys) >= 30
    for key in keys:
        with pytest.raises(ConfigError) as e:
            load_config(None, {key: value})
        assert f"{'.'.join(key)}: Input should be a finite number" in str(e.value), str(e.value)
    with pytest.raises(ValueError, match="finite number"):
        TaskLimits(time_s=value)
