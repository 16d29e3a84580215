"""The main job, `posttrain run`: evaluate, post-train with GRPO on the scheduler, evaluate again.

Read top to bottom:

1. resolve the config and the domains; write `<run-dir>/config.json`;
2. refuse to start if evaluation tasks leak into the training distribution (`contamination.json`;
   `allow_contamination = true` overrides, and the override is recorded);
3. evaluate the starting policy on the eval split of trained and held-out domains (`evals/before.json`);
4. train: the scheduler runs groups of episodes of the trained domains (train split) with the
   current policy; each step the trainer takes `groups_per_step` groups, updates the weights and
   becomes a new policy version; groups go to the store as they complete, metrics to
   `metrics.jsonl`, checkpoints to `checkpoints/step-N` (atomic; with the scheduler's state, so
   `--resume` continues where a killed run stopped);
5. evaluate the trained policy the same way (`evals/after.json`), report forgetting on the held-out
   domains (`forgetting/`), print the before/after table and write `report.html`.

`[model] path` may be an image-text-to-text model (config.json with a `vision_config`): the
trainer, the sampler and both evaluations then use it as a `VisionPolicy` (`_vision_model` refuses
the settings it cannot run under).
"""

from __future__ import annotations

import asyncio
import json
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from rich.console import Console

from posttrain.errors import is_disk_full, no_space, write_text_atomic
from posttrain.evaluation.trust import DEFAULT_MAX_INFRA_RATE
from posttrain.pipeline import checks, mix, report
from posttrain.pipeline.config import ConfigError, RunConfig, check_resume
from posttrain.pipeline.metrics import MetricsLog, step_row
from posttrain.pipeline.mix import take_with_signal
from posttrain.tasks.registry import RegistryError, match_domains
from posttrain.training.resume import RunCheckpoints, advance_recorded_failures


def _write_json(path: Path, data: Any) -> None:
    write_text_atomic(path, json.dumps(data, indent=2, default=str) + "\n")  # a full disk names the file


def _backend(scfg: Any, factory: Any) -> Any:
    """Where episodes run: None is the scheduler's local thread pool; 'ray' joins (or starts) a
    Ray cluster and spreads `max_running` episodes over `workers` actors."""
    if scfg.backend == "local":
        return None
    from posttrain.scheduling.ray_backend import RayBackend

    try:
        import ray
    except ImportError:
        raise ConfigError("scheduler.backend: 'ray' needs Ray (pip install 'ray>=2.30')") from None
    if not ray.is_initialized():
        ray.init(address=scfg.address, include_dashboard=False, log_to_driver=False)
    return RayBackend(factory, num_workers=scfg.workers, concurrency=max(1, scfg.max_running // scfg.workers))


def _vision_model(cfg: RunConfig) -> bool:
    """Whether `[model] path` is an image-text-to-text model (config.json with a `vision_config`);
    the settings such a model cannot run under are refused here, naming the field."""
    from posttrain.policies.vision import is_vision_model

    if not is_vision_model(cfg.model.path):
        return False
    what = f"{cfg.model.path} is an image-text-to-text model"
    if cfg.rollout.mode != "standard":  # VisionPolicy has no drafter
        raise ConfigError(f"[rollout] mode = {cfg.rollout.mode!r}: {what}, which decodes in the 'standard' "
                          "mode only (no speculative decoding); use mode = \"standard\"")
    if cfg.rollout.engine != "local":
        # a VLM is served (`python -m posttrain.policies.serve`) and evaluated through OpenAIPolicy, but
        # the routed sampler sends token ids to /v1/completions, which carry no images, and a vision
        # server has no weight-reload routes yet
        raise ConfigError(f"[rollout] engine = {cfg.rollout.engine!r}: {what}; training it through inference "
                          "servers is not supported yet (serving and evaluating it is): use engine = \"local\"")
    if cfg.trainer.lora is not None:  # a LoRA checkpoint of a vision model could not be resumed
        raise ConfigError(f"[trainer] lora: {what}; LoRA is not supported for vision models: remove [trainer.lora]")
    if cfg.trainer.engine != "local":
        raise ConfigError(f"[trainer] engine = {cfg.trainer.engine!r}: {what}; only the 'local' engine "
                          "trains vision models")
    return True


def _policy(trainer: Any) -> Any:
    """The trainer's current weights as a policy (a `VisionPolicy` for a vision model)."""
    from posttrain.training.publish import current_policy

    return current_policy(trainer)


class Job:
    def __init__(self, config: RunConfig, console: Console | None = None, *,
                 max_infra_rate: float = DEFAULT_MAX_INFRA_RATE) -> None:
        self.config = config
        self.max_infra_rate = max_infra_rate
        """the before/after evaluations' infrastructure-error share above which the run is not
        trusted (`posttrain.evaluation.trust`)"""
        if console is None:  # piped: rich would assume 80 columns and wrap the final table
            console = Console()
            console = console if console.is_terminal else Console(width=120)
        self.console = console
        self.run_dir = config.run_dir
        from posttrain.tasks.sources import use_sources

        added = [d.name for d in use_sources(config.domains.sources)]
        train = added if added and "train" not in config.domains.model_fields_set else config.domains.train
        # held-out domains are never trained, even where a train glob matches them (train = ["*"])
        self.heldout_domains = match_domains(config.domains.heldout) if config.domains.heldout else []
        heldout = {d.name for d in self.heldout_domains}
        self.train_domains = [d for d in match_domains(train)
                              if d.name not in heldout and checks.has_split(d, "train")]
        if not self.train_domains:
            raise RegistryError(f"no domain matching {train} (and not held out) has train-split tasks")
        self.vision = _vision_model(config)
        """the model is image-text-to-text: trained and sampled as a `VisionPolicy`"""
        self.baseline = self._baseline()
        self.base_from = self._base_from()
        self.metrics = MetricsLog(self.run_dir / "metrics.jsonl")
        self.checkpoints = RunCheckpoints(self.run_dir / "checkpoints", keep=config.keep_checkpoints)
        self.trainer_config = config.trainer
        self.stopped_early: str | None = None
        self.unfit: list[str] = []
        """domains left out because their prompts do not fit the model (`skip_unfit`)"""
        self.warnings: list[str] = []
        """what the summary must say about how far to trust the result (e.g. a resume that cannot
        be exact)"""
        self.tracker: Any = None
        """the experiment trackers of `[logging]` (open while `run` runs)"""

    def _baseline(self) -> Any:
        """`[eval] baseline`, loaded before anything runs (a bad file fails the run at once)."""
        if self.config.eval.baseline is None:
            return None
        from posttrain.evaluation.baseline import Baseline

        try:
            return Baseline.load(self.config.eval.baseline)
        except (OSError, ValueError) as e:
            raise ConfigError(f"eval.baseline: {e}") from None

    def _base_from(self) -> Path | None:
        """`[eval] base_from`, checked before anything runs: another run's directory, with a store."""
        given = self.config.eval.base_from
        if given is None:
            return None
        path = Path(given)
        if not (path / "store.sqlite").is_file():
            raise ConfigError(f"eval.base_from: {given}: no run there (it has no store.sqlite)")
        if path.resolve() == self.run_dir.resolve():
            raise ConfigError(f"eval.base_from: {given} is this run's own directory")
        return path

    def _reuse(self, policy: Any, name: str, tasks: list, store: Any) -> dict[str, Any]:
        """`[eval] base_from`: that run's samples of this evaluation copied into this run's store,
        where they are this evaluation's (`posttrain.evaluation.reuse`); the runner then draws only
        the rest. Repeated on a resume (nothing is stored twice), so the count stays whole."""
        if self.base_from is None:
            return {}
        from posttrain.evaluation.reuse import copy_evaluation
        from posttrain.storage.store import Store

        with Store.for_run_dir(self.base_from, readonly=True) as donor:
            done = copy_evaluation(donor, store, f"eval:{name}", policy.version, self.config.eval,
                                   {t.hash for _, t in tasks})
        if done.reason is not None:
            self.console.print(f"{name}: nothing reused from {self.base_from}: {done.reason}")
            return {}
        self.console.print(f"{name}: {done.copied} of {len(tasks) * self.config.eval.n_samples} samples "
                           f"reused from {self.base_from}")
        return {"from": str(self.base_from), "samples": done.copied}

    def gate(self, policy: Any, store: Any) -> dict[str, Any]:
        """The trained policy against `[eval] baseline`, like `posttrain eval --baseline`."""
        from posttrain.evaluation.baseline import gate

        outcome = gate(self.baseline, policy, name="gate", policy_spec=policy.version.name, store=store)
        outcome.candidate.save_to_run(self.run_dir)
        outcome.report.save_to_run(self.run_dir, "gate-vs-baseline")
        for line in outcome.lines():
            self.console.print(line)
        return {"baseline": self.config.eval.baseline, "passed": outcome.passed,
                "regressions": outcome.report.regressions}

    # -- steps of the job -------------------------------------------------------------
    def contamination_per_domain(self) -> int:
        """Training tasks a domain the contamination check samples: what the run can draw of it
        (its share of the groups), 200 at least."""
        cfg = self.config
        return max(200, cfg.rollout.groups_per_step * cfg.steps // max(1, len(self.train_domains)))

    def eval_tasks(self) -> list:
        return checks.eval_tasks(self.train_domains + self.heldout_domains, self.config.eval.tasks_per_domain)

    def evaluate(self, policy: Any, name: str, tasks: list, store: Any, sandbox_factory: Any) -> Any:
        """`evals/<name>.json` for `policy`: loaded if a killed run already wrote it for these very
        weights, settings and tasks; one of other weights (a finished run resumed to train
        further) or settings is superseded, its rows leave the store. One over another task set (a
        benchmark that chose other domains; a generator that changed some tasks) keeps the samples
        of the tasks it still has: they are the samples this evaluation would draw (same weights,
        settings and per-sample seeds). An evaluation cut short by a kill continues: the samples
        it stored are not generated again, their rows make its figures (`run_eval`'s `resume`)."""
        from posttrain.evaluation import EvalResult, run_eval
        from posttrain.evaluation.runner import not_resumable, superseded

        path = self.run_dir / "evals" / f"{name}.json"
        run_id = f"eval:{name}"
        hashes = {t.hash for _, t in tasks}
        if path.exists():
            old = EvalResult.load(path)
            if (why := superseded(old, policy.version.name, self.config.eval, hashes)) is None:
                self.console.print(f"{name}: loaded {path}")
                return old
            self.console.print(f"{name}: {path} {why}: evaluating again")
            path.unlink()
        if (why := not_resumable(store, run_id, policy.version.name, self.config.eval)) is not None:
            # cut short while evaluating weights since trained further (or with other settings)
            self.console.print(f"{name}: {why}: evaluating again")
            store.delete_run(run_id)
        elif stray := store.run_task_hashes(run_id) - hashes:
            kept = store.counts(run_id)["episodes"] - store.delete_run_tasks(run_id, stray)
            self.console.print(f"{name}: {len(stray)} of its stored tasks are not among this evaluation's: "
                               f"their samples dropped, the {kept} of the others kept")
        cfg = self.config
        t0 = time.perf_counter()
        from posttrain.pipeline.progress import EvalLog

        reused = self._reuse(policy, name, tasks, store)
        log = None if self.console.is_terminal else EvalLog(self.console, name)
        with self.console.status(f"evaluating {policy.version.name} ({name}): {len(tasks)} tasks "
                                 f"x {cfg.eval.samples} samples"):
            result = run_eval(policy, tasks, cfg.eval, name=name, policy_spec=policy.version.name, store=store,
                              sandbox_factory=sandbox_factory, resume=True, on_progress=log)
        result.reused = reused
        result.save_to_run(self.run_dir)
        self.console.print(f"{name}: {len(tasks)} tasks evaluated in {time.perf_counter() - t0:.1f}s")
        return result

    def make_trainer(self) -> tuple[Any, dict[str, Any]]:
        """A fresh trainer, or the latest checkpoint's with the scheduler state to resume (what a
        kill left half-done is cleaned up first: interrupted checkpoint directories, metrics lines
        of steps past the checkpoint, a torn last line)."""
        from posttrain.training.engines import ranks
        from posttrain.training.trainer import Trainer

        cfg = self.config
        _, world = ranks.rank_and_world()
        if world > 1 and self.trainer_config.engine != "fsdp":
            raise ConfigError(f"started by torchrun with {world} processes, but [trainer] engine = "
                              f"{self.trainer_config.engine!r}: use engine = \"fsdp\"")
        self.checkpoints.clean_interrupted()
        latest = self.checkpoints.latest()
        # under torchrun every rank builds the same trainer (`posttrain.training.engines.ranks`)
        if latest is None:
            ranks.announce("init", cfg.model.path, self.trainer_config, False)
            trainer = Trainer(cfg.model.path, self.trainer_config)
        else:
            ranks.announce("init", latest["path"], None, True)
            trainer = Trainer.resume(latest["path"])
        trainer.followers = world > 1
        if latest is None:
            self.metrics.resume(0)
            return trainer, {}
        self.console.print(f"resumed from {latest['path']} (step {trainer.step_count})")
        staleness = cfg.scheduler.max_staleness
        if staleness != 0 and trainer.step_count < cfg.steps:
            # which samples overlap which update depends on timing, in this run as in any other:
            # the resumed steps are a valid run, not a repeat of the one that was interrupted
            warning = (f"resumed at step {trainer.step_count} with scheduler.max_staleness = {staleness}: "
                       "not exactly resumable (which samples overlap which update depends on timing); "
                       "steps after the checkpoint differ from the interrupted run's")
            self.warnings.append(warning)
            self.console.print(f"[yellow]warning: {warning}")
        self.metrics.resume(trainer.step_count)
        return trainer, dict(trainer.extra.get("scheduler") or {})

    def checkpoint(self, trainer: Any, scheduler: Any, store: Any) -> Path:
        path = self.checkpoints.save(trainer, scheduler.state_dict())
        v = trainer.version
        store.put_policy_version(v.name, v.parent, v.weights_hash, str(path))
        return path

    async def train(self, trainer: Any, sched_state: dict, store: Any, sandbox_factory: Any,
                    before: Any = None) -> None:
        """GRPO on the scheduler up to `steps`; `before` (the base evaluation) seeds the adaptive
        weights when `[scheduler.adaptive] prior_groups` is set."""
        from posttrain.envs import EnvConfig
        from posttrain.envs.vision import for_policy
        from posttrain.pipeline.progress import RoundProgress
        from posttrain.scheduling import Scheduler, SchedulerStalled
        from posttrain.scheduling.episodes import RolloutEpisodeFactory
        from posttrain.training.publish import PolicyPublisher
        from posttrain.values.generation import SamplingParams

        cfg = self.config
        steps = cfg.steps
        if trainer.step_count >= steps:
            return
        if sched_state:  # failures stored after the save move their members on, as they did
            sched_state = advance_recorded_failures(sched_state, store.infra_attempts(cfg.name))
        quarantined = mix.load_quarantines(mix.quarantine_dirs(cfg))
        if quarantined:
            self.console.print(f"quarantine: {len(quarantined)} task(s) are never drawn for training")
        lookup = {d.name: d for d in mix.without_quarantined(self.train_domains, quarantined)}
        sampling = SamplingParams(temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p,
                                  max_tokens=cfg.rollout.max_tokens)
        scfg = cfg.scheduler  # group shape, seed and batch sizes filled in from the run (config.py)
        # Ray actors are other processes: they open their own sandboxes (a pool's handles
        # cannot be pickled to them)
        # The sampler reads its own copy of the weights when samples may be stale (generation
        # then overlaps training); with staleness 0 it shares the trained module.
        served = self._served_policy(trainer) if cfg.rollout.engine != "local" else None
        policy = served or PolicyPublisher(trainer, copy=scfg.max_staleness != 0, mode=cfg.rollout.mode)
        # a text-only policy gets image domains' textual fallbacks, as in evaluation (without
        # this every training episode of an image domain was an infra_error)
        env_config = for_policy(EnvConfig(context_policy=cfg.rollout.context), policy, list(lookup.values()))
        factory = RolloutEpisodeFactory(lookup, sampling=sampling, run_id=cfg.name, env_config=env_config,
                                        sandbox_factory=sandbox_factory if scfg.backend == "local" else None)
        specs = mix.domain_specs(cfg, self.train_domains, left_out=self.unfit)
        for warning in mix.concurrency_warnings(cfg, specs):
            if warning not in self.warnings:  # once, also when a second round trains
                self.warnings.append(warning)
                self.console.print(f"[yellow]warning: {warning}")

        def on_group(group: Any) -> None:  # results arrive intact: task and final workspace
            if served is not None:  # the version each episode was really served under
                served.record([r.trajectory for r in group.results])
            store.put_trajectories([(r.trajectory, r.task, r.workspace_archive) for r in group.results])

        def on_failure(result: Any) -> None:  # stored against its own task, never a regenerated one
            store.put_trajectory(result.trajectory, result.task, result.workspace_archive)

        def load_group(group_id: str) -> list:
            return list(store.trajectories(run_id=cfg.name, group_id=group_id))

        completed = store.group_ids(cfg.name)
        prior = None
        if scfg.adaptive.enabled and scfg.adaptive.prior_groups and before is not None:
            # given again on resume: the prior is an input, not part of the saved state
            prior = mix.signal_prior(before, [s for s in specs if s.name in lookup], scfg.group_size)
        sched = Scheduler(scfg, specs, policy, factory=factory, tasks=factory, backend=_backend(scfg, factory),
                          workers=scfg.workers,
                          state=sched_state or None, completed=completed, load_group=load_group,
                          on_group=on_group, on_failure=on_failure, version_name=trainer.version.name,
                          signal_prior=prior)
        policy.subscribe(sched.set_policy_version)  # the trainer's step is the scheduler's version
        names = [d.name for d in self.train_domains]
        with RoundProgress(self.console, f"GRPO {cfg.name}", steps, names, trainer.step_count) as view:
            async with sched:
                saved = trainer.step_count
                while trainer.step_count < steps:
                    try:
                        groups, takes = await take_with_signal(sched, cfg.rollout)
                    except SchedulerStalled as e:  # every domain retired (saturated) or quarantined
                        self.console.print(f"[yellow]training stops at step {trainer.step_count}: {e}")
                        self.stopped_early = str(e)
                        break
                    if not groups:
                        self.stopped_early = "the scheduler had no more groups to give"
                        break
                    served_metrics: dict[str, Any] = {"takes": takes}
                    if served is not None:  # the bound, on the versions really served
                        groups, served_metrics = served.filter_stale(groups, cfg.scheduler.max_staleness)
                    metrics = await asyncio.to_thread(trainer.step, [g.trajectories for g in groups])
                    metrics.update(served_metrics)
                    policy.publish()
                    at_checkpoint = trainer.step_count % cfg.checkpoint_every == 0 or trainer.step_count == steps
                    # per-domain scheduler figures go into metrics.jsonl at checkpoints only
                    row = step_row(trainer.step_count, metrics, groups, sched.metrics(per_domain=at_checkpoint))
                    if self.metrics.write(row) and self.tracker is not None:
                        from posttrain.tracking import flatten

                        self.tracker.log(trainer.step_count, flatten(row))
                    rewards: dict[str, list[float]] = {}
                    acts: dict[str, list[tuple[int, int]]] = {}
                    for g in groups:
                        rewards.setdefault(g.domain, []).extend(g.rewards)
                        acts.setdefault(g.domain, []).extend(
                            (len(t.turns), sum(len(u.tool_calls) for u in t.turns)) for t in g.trajectories)
                    view.update(trainer.step_count, {**metrics, **self._sched_brief(sched)}, rewards, acts)
                    if at_checkpoint:
                        self.checkpoint(trainer, sched, store)
                        saved = trainer.step_count
                if trainer.step_count != saved:  # stopped early: keep what was learned
                    self.checkpoint(trainer, sched, store)
                sched_metrics = sched.metrics(per_domain=True)
        _write_json(self.run_dir / "scheduler.json", sched_metrics)

    def _base_policy(self) -> Any:
        """The starting weights, read again (a resumed run that must still evaluate them)."""
        from posttrain.policies.local import TorchPolicy
        from posttrain.policies.vision import VisionPolicy

        path, device = self.config.model.path, self.config.model.device
        if not self.vision:
            return TorchPolicy(path, device=device)
        policy = VisionPolicy.load(path)
        policy.model.to(device)
        return policy

    def _served_policy(self, trainer: Any) -> Any:
        """Generation on inference servers kept at the trainer's weights (`rollout.engine`)."""
        from posttrain.pipeline.config import ConfigError
        from posttrain.policies.server.routed import ServedPolicy
        from posttrain.training.sync import ServerPublisher, WeightSync

        cfg = self.config
        try:
            served = ServedPolicy.from_spec(cfg.rollout.engine, tokenizer=trainer.tokenizer,
                                            version=trainer.version)
            sync = WeightSync(served.roots, self.run_dir / "weights", method=cfg.rollout.sync)
        except ValueError as e:
            raise ConfigError(f"config [rollout]: {e}") from None
        # the servers start from exactly the trainer's weights (and a resumed run's)
        return ServerPublisher(trainer, served, sync)

    @staticmethod
    def _sched_brief(sched: Any) -> dict[str, Any]:
        m = sched.metrics(per_domain=False)
        return {"generator_busy": m.get("generator_busy"),
                "infra_errors_total": m.get("infra_errors", 0)}

    def cumulative_forgetting(self, after: Any, trained: list[str]) -> dict[str, Any] | None:
        """Round 2 and later: forgetting from the base model (the first round's before) to this
        round's after, in `forgetting/<name>-from-base.json` (`pipeline.rounds`); its figures for
        summary.json, or None for a first round."""
        from posttrain.evaluation import write_forgetting
        from posttrain.pipeline import rounds

        try:
            earlier = rounds.earlier_rounds(self.config.model.path)
            report = rounds.cumulative_forgetting(earlier, self.config.name, after, trained)
        except ValueError as e:  # an earlier round's files are unreadable: said, not fatal
            self.warnings.append(f"cumulative forgetting not computed: {e}")
            self.console.print(f"[yellow]warning: cumulative forgetting not computed: {e}")
            return None
        if report is None:
            return None
        write_forgetting(self.run_dir, report, self.config.name + rounds.CUMULATIVE_SUFFIX)
        mean = report["held_out_mean_delta"]
        self.console.print(f"forgetting since the base model ({' -> '.join(report['rounds'])}): held-out mean "
                           f"{'-' if mean is None else f'{mean:+.3f}'}, significant drops: "
                           f"{', '.join(report['forgotten']) or 'none'}")
        return {k: report[k] for k in ("before", "after", "rounds", "held_out_mean_delta", "trained_mean_delta",
                                       "forgotten")}

    # -- the whole job ----------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        import torch
        from transformers.utils import logging as hf_logging

        from posttrain.evaluation import forgetting_report, write_forgetting
        from posttrain.storage.store import Store
        from posttrain.training.engines import ranks

        hf_logging.disable_progress_bar()  # our own progress display says what is happening
        from posttrain.scheduling.engine import check_sandbox, sandbox_pool

        cfg = self.config
        t_start = time.perf_counter()
        check_sandbox(self.train_domains + self.heldout_domains)  # not after minutes of checks
        check_resume(cfg)  # before config.json is written over: a resume repeats the recorded config
        self.run_dir.mkdir(parents=True, exist_ok=True)
        _write_json(self.run_dir / "config.json", cfg.model_dump(mode="json"))
        if cfg.model.threads:
            torch.set_num_threads(cfg.model.threads)
        self.console.print(f"[bold]posttrain run[/] {cfg.name}: {len(self.train_domains)} trained domains, "
                           f"{len(self.heldout_domains)} held out -> {self.run_dir}")
        eval_tasks = self.eval_tasks()
        trainer, sched_state = self.make_trainer()
        unfit = checks.check_context(_policy(trainer), self.train_domains, eval_tasks,
                                     skip=cfg.domains.skip_unfit, console=self.console)
        if unfit:  # left out, said once above and recorded in summary.json
            self.unfit = sorted(unfit)
            self.train_domains = [d for d in self.train_domains if d.name not in unfit]
            self.heldout_domains = [d for d in self.heldout_domains if d.name not in unfit]
            eval_tasks = [(d, t) for d, t in eval_tasks if d.name not in unfit]
            if not self.train_domains:
                raise ConfigError("no trained domain fits the model's context (all were left out)")
        # after the context check: a domain left out is not trained, so it cannot leak
        checks.check_contamination(self.train_domains, eval_tasks, run_dir=self.run_dir,
                                   per_domain=self.contamination_per_domain(),
                                   allow=cfg.allow_contamination, console=self.console)
        with ExitStack() as stack:
            store = stack.enter_context(Store.for_run_dir(self.run_dir))
            from posttrain.tracking import eval_scalars, open_tracker

            self.tracker = open_tracker(cfg.logging, self.run_dir, cfg.name, cfg.model_dump(mode="json"))
            stack.callback(self.tracker.close)
            from posttrain.tasks.sources import absolute

            # the sources' paths made absolute: `posttrain replay` re-reads them from anywhere
            store.start_run(cfg.name, {**cfg.model_dump(mode="json"),
                                       "sources": [absolute(s) for s in cfg.domains.sources]})
            sandbox_factory = stack.enter_context(sandbox_pool(self.train_domains + self.heldout_domains,
                                                               cfg.scheduler.workers))
            start = trainer.version
            if trainer.step_count == 0:
                store.put_policy_version(start.name, start.parent, start.weights_hash, cfg.model.path)
            base_policy = self._base_policy() if trainer.step_count else _policy(trainer)
            before = self.evaluate(base_policy, "before", eval_tasks, store, sandbox_factory)
            self.tracker.log(0, eval_scalars(before.summary, "before"))
            del base_policy
            t_train = time.perf_counter()
            asyncio.run(self.train(trainer, sched_state, store, sandbox_factory, before))
            ranks.finish()  # under torchrun, the other ranks' work is done
            train_s = time.perf_counter() - t_train
            after = self.evaluate(_policy(trainer), "after", eval_tasks, store, sandbox_factory)
            self.tracker.log(trainer.step_count, eval_scalars(after.summary, "after"))
            gate = self.gate(_policy(trainer), store) if self.baseline is not None else None
        trained = [d.name for d in self.train_domains]
        forgetting = forgetting_report(before, after, trained)
        write_forgetting(self.run_dir, forgetting, cfg.name)
        cumulative = self.cumulative_forgetting(after, trained)
        k = cfg.eval.n_samples
        summary = report.summarize(cfg.name, cfg.steps, k, before, after, trained,
                                   [d.name for d in self.heldout_domains], train_s,
                                   time.perf_counter() - t_start, self.stopped_early)
        summary["unfit_domains"] = self.unfit
        summary["steps_done"] = trainer.step_count
        summary["warnings"] = self.warnings
        # the run's result is what was asked only if it trained every step and both evaluations
        # can be trusted; the command exits 3 otherwise (`posttrain.errors`)
        summary["untrustworthy"] = report.untrustworthy_reasons(
            before, after, self.max_infra_rate, steps=cfg.steps, steps_done=trainer.step_count,
            stopped_early=self.stopped_early)
        if gate is not None:
            summary["gate"] = gate
        if cumulative is not None:
            summary["cumulative_forgetting"] = cumulative
        _write_json(self.run_dir / "summary.json", summary)
        report.print_table(self.console, cfg.steps, k, before, after, trained, summary)
        try:
            from posttrain.evaluation import build_report

            html = build_report(self.run_dir)
            self.console.print(f"report: {html}")
        except Exception as e:  # noqa: BLE001 - a report failure must not lose the run's results
            if is_disk_full(e, self.run_dir):  # but a full disk is said, and is not success
                raise no_space(self.run_dir / "report.html", "writing the report") from e
            self.console.print(f"[yellow]report not written: {type(e).__name__}: {e}")
        return summary
