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
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from rich.console import Console

from posttrain.pipeline import checks, report
from posttrain.pipeline.config import ConfigError, RunConfig
from posttrain.pipeline.metrics import MetricsLog, step_row
from posttrain.tasks.registry import RegistryError, match_domains
from posttrain.training.resume import RunCheckpoints, advance_recorded_failures


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n")
    os.replace(tmp, path)


class Job:
    def __init__(self, config: RunConfig, console: Console | None = None) -> None:
        self.config = config
        if console is None:  # piped: rich would assume 80 columns and wrap the final table
            console = Console()
            console = console if console.is_terminal else Console(width=120)
        self.console = console
        self.run_dir = config.run_dir
        from posttrain.tasks.sources import use_sources

        added = [d.name for d in use_sources(config.domains.sources)]
        train = added if added and "train" not in config.domains.model_fields_set else config.domains.train
        self.train_domains = [d for d in match_domains(train) if checks.has_split(d, "train")]
        if not self.train_domains:
            raise RegistryError(f"no domain matching {train} has train-split tasks")
        trained = {d.name for d in self.train_domains}
        self.heldout_domains = ([d for d in match_domains(config.domains.heldout) if d.name not in trained]
                                if config.domains.heldout else [])
        self.metrics = MetricsLog(self.run_dir / "metrics.jsonl")
        self.checkpoints = RunCheckpoints(self.run_dir / "checkpoints", keep=config.keep_checkpoints)
        self.trainer_config = self._trainer_config()
        self.stopped_early: str | None = None
        self.tracker: Any = None
        """the experiment trackers of `[logging]` (open while `run` runs)"""

    def _trainer_config(self) -> Any:
        """The trainer's settings, checked before anything runs (errors name the field)."""
        from posttrain.training.config import TrainerConfig

        cfg = self.config
        try:
            return TrainerConfig.from_dict({"run_name": cfg.name, "seed": cfg.seed, "device": cfg.model.device,
                                            "temperature": cfg.rollout.temperature, **cfg.trainer},
                                           where="config [trainer]")
        except (TypeError, ValueError) as e:
            raise ConfigError(str(e)) from None

    # -- steps of the job -------------------------------------------------------------
    def eval_tasks(self) -> list:
        return checks.eval_tasks(self.train_domains + self.heldout_domains, self.config.eval.tasks_per_domain)

    def evaluate(self, policy: Any, name: str, tasks: list, store: Any, sandbox_factory: Any) -> Any:
        """`evals/<name>.json` for `policy`: loaded if a killed run already wrote it for these very
        weights; an evaluation of other weights (a finished run resumed to train further) is
        superseded, its rows leave the store. Samples are seeded by identity, so an evaluation
        cut short by a kill and run again writes each sample once (the store keeps one row per
        identity)."""
        from posttrain.evaluation import EvalConfig, EvalResult, run_eval

        path = self.run_dir / "evals" / f"{name}.json"
        if path.exists():
            old = EvalResult.load(path)
            if old.policy == policy.version.name:
                self.console.print(f"{name}: loaded {path}")
                return old
            self.console.print(f"{name}: {path} evaluated {old.policy}, not {policy.version.name}: evaluating again")
            store.delete_run(f"eval:{name}")
            path.unlink()
        cfg = self.config
        ks = tuple(sorted({1, cfg.eval.samples}))
        t0 = time.perf_counter()
        with self.console.status(f"evaluating {policy.version.name} ({name}): {len(tasks)} tasks "
                                 f"x {cfg.eval.samples} samples"):
            result = run_eval(policy, tasks, EvalConfig(k=ks, temperature=cfg.eval.temperature,
                                                        max_tokens=cfg.rollout.max_tokens,
                                                        workers=cfg.scheduler.workers, seed=cfg.seed),
                              name=name, policy_spec=policy.version.name, store=store,
                              sandbox_factory=sandbox_factory)
        result.save_to_run(self.run_dir)
        self.console.print(f"{name}: {len(tasks)} tasks evaluated in {time.perf_counter() - t0:.1f}s")
        return result

    def make_trainer(self) -> tuple[Any, dict[str, Any]]:
        """A fresh trainer, or the latest checkpoint's with the scheduler state to resume (what a
        kill left half-done is cleaned up first: interrupted checkpoint directories, metrics lines
        of steps past the checkpoint, a torn last line)."""
        from posttrain.training.trainer import Trainer

        cfg = self.config
        self.checkpoints.clean_interrupted()
        trainer = self.checkpoints.resume()
        if trainer is None:
            self.metrics.resume(0)
            return Trainer(cfg.model.path, self.trainer_config), {}
        latest = self.checkpoints.latest()
        assert latest is not None  # resume() found it
        self.console.print(f"resumed from {latest['path']} (step {trainer.step_count})")
        self.metrics.resume(trainer.step_count)
        return trainer, dict(trainer.extra.get("scheduler") or {})

    def checkpoint(self, trainer: Any, scheduler: Any, store: Any) -> Path:
        path = self.checkpoints.save(trainer, scheduler.state_dict())
        v = trainer.version
        store.put_policy_version(v.name, v.parent, v.weights_hash, str(path))
        return path

    async def train(self, trainer: Any, sched_state: dict, store: Any, sandbox_factory: Any) -> None:
        from posttrain.envs import needs_sandbox
        from posttrain.pipeline.progress import RoundProgress
        from posttrain.scheduling import BatchConfig, DomainSpec, Scheduler, SchedulerConfig, SchedulerStalled
        from posttrain.scheduling.episodes import RolloutEpisodeFactory
        from posttrain.training.publish import PolicyPublisher
        from posttrain.values.generation import SamplingParams

        cfg = self.config
        steps = cfg.steps
        if trainer.step_count >= steps:
            return
        if sched_state:  # failures stored after the save move their members on, as they did
            sched_state = advance_recorded_failures(sched_state, store.infra_attempts(cfg.name))
        lookup = {d.name: d for d in self.train_domains}
        sampling = SamplingParams(temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p,
                                  max_tokens=cfg.rollout.max_tokens)
        factory = RolloutEpisodeFactory(lookup, sampling=sampling, sandbox_factory=sandbox_factory,
                                        run_id=cfg.name)
        specs = [DomainSpec(d.name, weight=cfg.domains.weights.get(d.name, 1.0), sandboxed=needs_sandbox(d),
                            light=not needs_sandbox(d)) for d in self.train_domains]
        per_step = cfg.rollout.groups_per_step * cfg.rollout.group_size
        # One step's episodes fit in one generate call: a CPU model runs a batch of 256 tiny
        # prompts barely slower than a batch of 64.
        scfg = SchedulerConfig(group_size=cfg.rollout.group_size, groups_per_step=cfg.rollout.groups_per_step,
                               max_staleness=cfg.scheduler.max_staleness, seed=cfg.seed,
                               max_running=max(64, per_step), batch=BatchConfig(max_batch=max(64, per_step)))
        # The sampler reads its own copy of the weights when samples may be stale (generation
        # then overlaps training); with staleness 0 it shares the trained module.
        policy = PolicyPublisher(trainer, copy=cfg.scheduler.max_staleness > 0)

        def on_group(group: Any) -> None:  # results arrive intact: task and final workspace
            store.put_trajectories([(r.trajectory, r.task, r.workspace_archive) for r in group.results])

        def on_failure(result: Any) -> None:  # stored against its own task, never a regenerated one
            store.put_trajectory(result.trajectory, result.task, result.workspace_archive)

        def load_group(group_id: str) -> list:
            return list(store.trajectories(run_id=cfg.name, group_id=group_id))

        completed = store.group_ids(cfg.name)
        sched = Scheduler(scfg, specs, policy, factory=factory, tasks=factory, workers=cfg.scheduler.workers,
                          state=sched_state or None, completed=completed, load_group=load_group,
                          on_group=on_group, on_failure=on_failure, version_name=trainer.version.name)
        policy.subscribe(sched.set_policy_version)  # the trainer's step is the scheduler's version
        names = [d.name for d in self.train_domains]
        with RoundProgress(self.console, f"GRPO {cfg.name}", steps, names, trainer.step_count) as view:
            async with sched:
                saved = trainer.step_count
                while trainer.step_count < steps:
                    try:
                        groups = await sched.take(cfg.rollout.groups_per_step)
                    except SchedulerStalled as e:  # every domain retired (saturated) or quarantined
                        self.console.print(f"[yellow]training stops at step {trainer.step_count}: {e}")
                        self.stopped_early = str(e)
                        break
                    if not groups:
                        break
                    metrics = await asyncio.to_thread(trainer.step, [g.trajectories for g in groups])
                    policy.publish()
                    at_checkpoint = trainer.step_count % cfg.checkpoint_every == 0 or trainer.step_count == steps
                    # per-domain scheduler figures go into metrics.jsonl at checkpoints only
                    row = step_row(trainer.step_count, metrics, groups, sched.metrics(per_domain=at_checkpoint))
                    if self.metrics.write(row) and self.tracker is not None:
                        from posttrain.tracking import flatten

                        self.tracker.log(trainer.step_count, flatten(row))
                    rewards: dict[str, list[float]] = {}
                    for g in groups:
                        rewards.setdefault(g.domain, []).extend(g.rewards)
                    view.update(trainer.step_count, {**metrics, **self._sched_brief(sched)}, rewards)
                    if at_checkpoint:
                        self.checkpoint(trainer, sched, store)
                        saved = trainer.step_count
                if trainer.step_count != saved:  # stopped early: keep what was learned
                    self.checkpoint(trainer, sched, store)
                sched_metrics = sched.metrics(per_domain=True)
        _write_json(self.run_dir / "scheduler.json", sched_metrics)

    @staticmethod
    def _sched_brief(sched: Any) -> dict[str, Any]:
        m = sched.metrics(per_domain=False)
        return {"generator_busy": m.get("generator_busy"),
                "infra_errors_total": m.get("infra_errors", 0)}

    # -- the whole job ----------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        import torch
        from transformers.utils import logging as hf_logging

        from posttrain.evaluation import forgetting_report, write_forgetting
        from posttrain.policies.local import TorchPolicy
        from posttrain.storage.store import Store

        hf_logging.disable_progress_bar()  # our own progress display says what is happening
        cfg = self.config
        t_start = time.perf_counter()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        _write_json(self.run_dir / "config.json", cfg.model_dump(mode="json"))
        if cfg.model.threads:
            torch.set_num_threads(cfg.model.threads)
        self.console.print(f"[bold]posttrain run[/] {cfg.name}: {len(self.train_domains)} trained domains, "
                           f"{len(self.heldout_domains)} held out -> {self.run_dir}")
        eval_tasks = self.eval_tasks()
        cfg_r = cfg.rollout
        checks.check_contamination(self.train_domains, eval_tasks, run_dir=self.run_dir,
                                   per_domain=max(200, cfg_r.groups_per_step * cfg.steps
                                                  // max(1, len(self.train_domains))),
                                   allow=cfg.allow_contamination, console=self.console)
        trainer, sched_state = self.make_trainer()
        checks.check_context(trainer.policy(), self.train_domains, eval_tasks)
        with ExitStack() as stack:
            store = stack.enter_context(Store.for_run_dir(self.run_dir))
            from posttrain.tracking import eval_scalars, open_tracker

            self.tracker = open_tracker(cfg.logging, self.run_dir, cfg.name, cfg.model_dump(mode="json"))
            stack.callback(self.tracker.close)
            store.start_run(cfg.name, cfg.model_dump(mode="json"))
            from posttrain.scheduling.engine import sandbox_pool

            sandbox_factory = stack.enter_context(sandbox_pool(self.train_domains + self.heldout_domains,
                                                               cfg.scheduler.workers))
            start = trainer.version
            if trainer.step_count == 0:
                store.put_policy_version(start.name, start.parent, start.weights_hash, cfg.model.path)
            base_policy = (TorchPolicy(cfg.model.path, device=cfg.model.device) if trainer.step_count
                           else trainer.policy())
            before = self.evaluate(base_policy, "before", eval_tasks, store, sandbox_factory)
            self.tracker.log(0, eval_scalars(before.summary, "before"))
            del base_policy
            t_train = time.perf_counter()
            asyncio.run(self.train(trainer, sched_state, store, sandbox_factory))
            train_s = time.perf_counter() - t_train
            after = self.evaluate(trainer.policy(), "after", eval_tasks, store, sandbox_factory)
            self.tracker.log(trainer.step_count, eval_scalars(after.summary, "after"))
        trained = [d.name for d in self.train_domains]
        forgetting = forgetting_report(before, after, trained)
        write_forgetting(self.run_dir, forgetting, cfg.name)
        k = cfg.eval.samples
        summary = report.summarize(cfg.name, cfg.steps, k, before, after, trained,
                                   [d.name for d in self.heldout_domains], train_s,
                                   time.perf_counter() - t_start, self.stopped_early)
        _write_json(self.run_dir / "summary.json", summary)
        report.print_table(self.console, cfg.steps, k, before, after, trained, summary)
        try:
            from posttrain.evaluation import build_report

            html = build_report(self.run_dir)
            self.console.print(f"report: {html}")
        except Exception as e:  # noqa: BLE001 - a report failure must not lose the run's results
            self.console.print(f"[yellow]report not written: {type(e).__name__}: {e}")
        return summary
