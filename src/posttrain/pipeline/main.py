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
import shutil
import time
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from posttrain.pipeline.config import RunConfig
from posttrain.tasks.domain import Domain, NoTasksInSplit
from posttrain.tasks.registry import RegistryError, match_domains
from posttrain.policies.base import Policy

LATEST = "latest.json"


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str) + "\n")
    os.replace(tmp, path)


def _pass(result: Any, domain: str, key: str) -> float | None:
    entry = result.summary["domains"].get(domain, {}).get(key)
    return None if entry is None else entry.get("value")


def _has_split(domain: Domain, split: str) -> bool:
    try:
        domain.task(0, split)  # type: ignore[arg-type]
    except NoTasksInSplit:
        return False
    return True


def _needs_sandbox(domains: list[Domain]) -> bool:
    return any(d.env == "tools" or d.verifier.needs_sandbox for d in domains)


DOMAIN_SCHED_KEYS = ("quota", "sample_share", "cost_share", "effective_weight", "samples", "cost",
                     "sandbox_s", "gen_s", "tokens", "queue_wait_p50_s", "queue_wait_p99_s",
                     "max_service_gap_s", "infra_errors", "retries", "groups_dropped", "signal_share")
"""the scheduler's per-domain figures written into metrics.jsonl every `checkpoint_every` steps"""


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
        self.train_domains = [d for d in match_domains(train) if _has_split(d, "train")]
        if not self.train_domains:
            raise RegistryError(f"no domain matching {train} has train-split tasks")
        trained = {d.name for d in self.train_domains}
        self.heldout_domains = ([d for d in match_domains(config.domains.heldout) if d.name not in trained]
                                if config.domains.heldout else [])
        self.metrics_path = self.run_dir / "metrics.jsonl"
        self.trainer_config = self._trainer_config()
        self.stopped_early: str | None = None
        self.tracker: Any = None
        """the experiment trackers of `[logging]` (open while `run` runs)"""

    def _trainer_config(self) -> Any:
        """The trainer's settings, checked before anything runs (errors name the field)."""
        from posttrain.pipeline.config import ConfigError
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
        out, seen = [], set()
        for d in self.train_domains + self.heldout_domains:
            if not _has_split(d, "eval"):
                continue  # an imported single task that lives in the train split only
            for seed in range(self.config.eval.tasks_per_domain):
                task = d.task(seed, "eval")
                if task.hash not in seen:
                    seen.add(task.hash)
                    out.append((d, task))
        return out

    def check_contamination(self, eval_tasks: list) -> None:
        from posttrain.evaluation.contamination import check_contamination, guard_training

        per_domain = max(200, self.config.rollout.groups_per_step * self.config.steps
                         // max(1, len(self.train_domains)))
        train = [d.task(seed, "train") for d in self.train_domains for seed in range(min(per_domain, 2000))]
        report = check_contamination(train, [t for _, t in eval_tasks])
        guard_training(report, self.run_dir, allow=self.config.allow_contamination)
        if not report.ok:
            self.console.print(f"[yellow]contamination: {len(report.matches)} eval tasks overlap the "
                               "training sample; allowed by the config (recorded in contamination.json)")

    def check_context(self, policy: Policy, eval_tasks: list, per_domain: int = 4) -> None:
        """Refuse to start when a domain's prompts do not fit the model's context: such an
        episode can never run (it is not an infrastructure failure that a retry would cure).
        Looks at the first `per_domain` train tasks of each trained domain and at the eval tasks."""
        from posttrain.envs import initial_observation
        from posttrain.pipeline.config import ConfigError
        from posttrain.values.generation import GenerationRequest, Message, SamplingParams

        limit = policy.max_positions
        if limit is None:
            return  # the backend does not say (a server checks on its own)
        tasks = [(d, d.task(seed, "train")) for d in self.train_domains for seed in range(per_domain)]
        worst: dict[str, tuple[int, str]] = {}
        for d, task in tasks + list(eval_tasks):
            text = initial_observation(d, task)
            ids = policy.render(GenerationRequest((Message("user", text),), SamplingParams()))
            if ids is None:
                return  # no tokenizer to measure with
            n = len(ids)
            if n >= limit and n > worst.get(d.name, (0, ""))[0]:
                worst[d.name] = (n, task.key)
        if worst:
            trained = {d.name for d in self.train_domains}
            lines = [f"  {name} ({'domains.train' if name in trained else 'domains.heldout'}): "
                     f"{n} prompt tokens (task {key})" for name, (n, key) in sorted(worst.items())]
            raise ConfigError(f"{len(worst)} domain(s) have prompts that do not fit the model's context "
                              f"of {limit} positions ({policy.version.name}), leaving no room to answer:\n"
                              + "\n".join(lines) + "\nRemove them from the config, or use a model "
                              "with a longer context.")

    def evaluate(self, policy: Any, name: str, tasks: list, store: Any, sandbox_factory: Any) -> Any:
        from posttrain.evaluation import EvalConfig, EvalResult, run_eval

        path = self.run_dir / "evals" / f"{name}.json"
        if path.exists():
            self.console.print(f"{name}: loaded {path}")
            return EvalResult.load(path)
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
        from posttrain.training.trainer import Trainer

        cfg = self.config
        latest = self.run_dir / "checkpoints" / LATEST
        if latest.exists():
            ckpt = json.loads(latest.read_text())["path"]
            trainer = Trainer.resume(ckpt, None)
            self.console.print(f"resumed from {ckpt} (step {trainer.step_count})")
            return trainer, dict(trainer.extra.get("scheduler") or {})
        return Trainer(cfg.model.path, self.trainer_config), {}

    def checkpoint(self, trainer: Any, scheduler: Any, store: Any) -> Path:
        path = self.run_dir / "checkpoints" / f"step-{trainer.step_count}"
        trainer.save(path, extra={"scheduler": scheduler.state_dict()})
        v = trainer.version
        store.put_policy_version(v.name, v.parent, v.weights_hash, str(path))
        _write_json(self.run_dir / "checkpoints" / LATEST, {"path": str(path), "step": trainer.step_count,
                                                           "version": v.name})
        self.prune_checkpoints()
        return path

    def prune_checkpoints(self) -> list[Path]:
        """Delete all but the newest `keep_checkpoints` step-N directories (after `latest.json`
        points at the new one, so a crash in here loses nothing that resuming needs)."""
        ckpts = sorted((p for p in (self.run_dir / "checkpoints").glob("step-*")
                        if p.is_dir() and p.name[5:].isdigit()), key=lambda p: int(p.name[5:]))
        old = ckpts[:-self.config.keep_checkpoints]
        for p in old:
            shutil.rmtree(p, ignore_errors=True)
        return old

    async def train(self, trainer: Any, sched_state: dict, store: Any, sandbox_factory: Any) -> None:
        from posttrain.values.generation import SamplingParams
        from posttrain.scheduling import BatchConfig, DomainSpec, Scheduler, SchedulerConfig, SchedulerStalled
        from posttrain.scheduling.episodes import RolloutEpisodeFactory
        from posttrain.pipeline.progress import RoundProgress
        from posttrain.pipeline.sync import SyncedPolicy

        cfg = self.config
        steps = cfg.steps
        if trainer.step_count >= steps:
            return
        lookup = {d.name: d for d in self.train_domains}
        sampling = SamplingParams(temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p,
                                  max_tokens=cfg.rollout.max_tokens)
        factory = RolloutEpisodeFactory(lookup, sampling=sampling, sandbox_factory=sandbox_factory,
                                        run_id=cfg.name)
        specs = [DomainSpec(d.name, weight=cfg.domains.weights.get(d.name, 1.0)) for d in self.train_domains]
        per_step = cfg.rollout.groups_per_step * cfg.rollout.group_size
        # One step's episodes fit in one generate call: a CPU model runs a batch of 256 tiny
        # prompts barely slower than a batch of 64.
        scfg = SchedulerConfig(group_size=cfg.rollout.group_size, groups_per_step=cfg.rollout.groups_per_step,
                               max_staleness=cfg.scheduler.max_staleness, seed=cfg.seed,
                               max_running=max(64, per_step), batch=BatchConfig(max_batch=max(64, per_step)))
        # The sampler reads its own copy of the weights when samples may be stale (generation
        # then overlaps training); with staleness 0 it shares the trained module.
        served = self._served_policy(trainer) if cfg.rollout.engine != "local" else None
        policy = served or SyncedPolicy(trainer, copy=cfg.scheduler.max_staleness > 0)

        def on_group(group: Any) -> None:
            if served is not None:  # the version each episode was really served under
                served.record(group.trajectories)
            store.put_trajectories([(t, lookup[t.domain].task(group.task_seed, "train"), None)
                                    for t in group.trajectories])

        def on_failure(traj: Any) -> None:
            store.put_trajectory(traj, lookup[traj.domain].task(int(traj.seed), "train")
                                 if traj.seed is not None else None)

        def load_group(group_id: str) -> list:
            return list(store.trajectories(run_id=cfg.name, group_id=group_id))

        completed = store.group_ids(cfg.name)
        sched = Scheduler(scfg, specs, policy, factory=factory, workers=cfg.scheduler.workers,
                          state=sched_state or None, completed=completed, load_group=load_group,
                          on_group=on_group, on_failure=on_failure, version_name=trainer.version.name)
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
                    served_metrics: dict[str, Any] = {}
                    if served is not None:  # the bound, on the versions really served
                        groups, served_metrics = served.filter_stale(groups, cfg.scheduler.max_staleness)
                    metrics = await asyncio.to_thread(trainer.step, [g.trajectories for g in groups])
                    metrics.update(served_metrics)
                    policy.sync()
                    sched.set_policy_version(trainer.version.name)
                    at_checkpoint = trainer.step_count % cfg.checkpoint_every == 0 or trainer.step_count == steps
                    # per-domain scheduler figures go into metrics.jsonl at checkpoints only
                    self._log(trainer.step_count, metrics, groups, sched.metrics(per_domain=at_checkpoint))
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

    def _served_policy(self, trainer: Any) -> Any:
        """Generation on inference servers kept at the trainer's weights (`rollout.engine`)."""
        from posttrain.pipeline.config import ConfigError
        from posttrain.policies.server.routed import ServedPolicy
        from posttrain.training.sync import ServerSyncedPolicy, WeightSync

        cfg = self.config
        try:
            served = ServedPolicy.from_spec(cfg.rollout.engine, tokenizer=trainer.tokenizer,
                                            version=trainer.version)
            sync = WeightSync(served.roots, self.run_dir / "weights", method=cfg.rollout.sync)
        except ValueError as e:
            raise ConfigError(f"config [rollout]: {e}") from None
        # the servers start from exactly the trainer's weights (and a resumed run's)
        return ServerSyncedPolicy(trainer, served, sync)

    @staticmethod
    def _sched_brief(sched: Any) -> dict[str, Any]:
        m = sched.metrics(per_domain=False)
        return {"generator_busy": m.get("generator_busy"),
                "infra_errors_total": m.get("infra_errors", 0)}

    def _log(self, step: int, metrics: dict, groups: list, sched: dict) -> None:
        row: dict[str, Any] = {"step": step, "time": time.time(), **{k: v for k, v in metrics.items()
                                                                      if isinstance(v, (int, float))}}
        by_family: dict[str, list[float]] = {}
        for g in groups:
            by_family.setdefault(g.domain.split(".")[0], []).extend(g.rewards)
            row.setdefault(f"domain/{g.domain}/reward", [])
            row[f"domain/{g.domain}/reward"].extend(g.rewards)
        for key in [k for k in row if k.startswith("domain/")]:
            vals = row[key]
            row[key] = sum(vals) / len(vals) if vals else None
        for fam, vals in by_family.items():
            row[f"family/{fam}/reward"] = sum(vals) / len(vals)
            row[f"family/{fam}/pass_rate"] = sum(v >= 1.0 for v in vals) / len(vals)
        row["staleness_max"] = max((g.staleness for g in groups), default=0)
        for key in ("generator_busy", "worker_utilization", "infra_errors", "retries", "lost",
                    "queue_wait_p50_s", "queue_wait_p99_s", "max_wait_s"):
            if key in sched:
                row[f"sched/{key}"] = sched[key]
        for key in ("quarantined", "retired"):  # domain -> why; the per-domain table is in scheduler.json
            row[f"sched/{key}"] = sorted(sched.get(key) or {})
        if "domains" in sched:  # every checkpoint_every steps: per domain, against its quota
            row["sched/domains"] = {d: {k: v[k] for k in DOMAIN_SCHED_KEYS if k in v}
                                    for d, v in sched["domains"].items()}
        with open(self.metrics_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(row, default=str) + "\n")
        if self.tracker is not None:
            from posttrain.tracking import flatten

            self.tracker.log(step, flatten(row))

    # -- the whole job ----------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        import torch

        from posttrain.evaluation import forgetting_report, write_forgetting
        from posttrain.policies.local import TorchPolicy
        from posttrain.storage.store import Store

        from transformers.utils import logging as hf_logging

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
        self.check_contamination(eval_tasks)
        trainer, sched_state = self.make_trainer()
        self.check_context(trainer.policy(), eval_tasks)
        with ExitStack() as stack:
            store = stack.enter_context(Store.for_run_dir(self.run_dir))
            from posttrain.tracking import eval_scalars, open_tracker

            self.tracker = open_tracker(cfg.logging, self.run_dir, cfg.name, cfg.model_dump(mode="json"))
            stack.callback(self.tracker.close)
            store.start_run(cfg.name, cfg.model_dump(mode="json"))
            sandbox_factory = None
            if _needs_sandbox(self.train_domains + self.heldout_domains):
                from posttrain.envs import sandbox_preload
                from posttrain.sandbox import SandboxPool

                preload = sandbox_preload(self.train_domains + self.heldout_domains)
                sandbox_factory = stack.enter_context(SandboxPool(size=cfg.scheduler.workers,
                                                                  preload=preload)).sandbox
            start = trainer.version
            if trainer.step_count == 0:
                store.put_policy_version(start.name, start.parent, start.weights_hash, cfg.model.path)
            base_policy = TorchPolicy(cfg.model.path, device=cfg.model.device) if trainer.step_count else trainer.policy()
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
        summary = self.summarize(before, after, trained, train_s, time.perf_counter() - t_start)
        _write_json(self.run_dir / "summary.json", summary)
        self.print_table(before, after, trained, summary)
        try:
            from posttrain.evaluation import build_report

            report = build_report(self.run_dir)
            self.console.print(f"report: {report}")
        except Exception as e:  # noqa: BLE001 - a report failure must not lose the run's results
            self.console.print(f"[yellow]report not written: {type(e).__name__}: {e}")
        return summary

    def summarize(self, before: Any, after: Any, trained: list[str], train_s: float, total_s: float) -> dict:
        def mean(result: Any, names: list[str], key: str) -> float | None:
            vals = [_pass(result, n, key) for n in names]
            vals = [v for v in vals if v is not None]
            return sum(vals) / len(vals) if vals else None

        k = self.config.eval.samples
        held = [d.name for d in self.heldout_domains]
        out = {"run": self.config.name, "steps": self.config.steps,
               "base_pass1": mean(before, trained, "pass@1"), f"base_pass{k}": mean(before, trained, f"pass@{k}"),
               "final_pass1": mean(after, trained, "pass@1"), f"final_pass{k}": mean(after, trained, f"pass@{k}"),
               "heldout_base_pass1": mean(before, held, "pass@1"),
               "heldout_final_pass1": mean(after, held, "pass@1"),
               "train_s": round(train_s, 1), "total_s": round(total_s, 1), "stopped_early": self.stopped_early}
        if out["heldout_base_pass1"] is not None and out["heldout_final_pass1"] is not None:
            out["untrained_delta"] = out["heldout_final_pass1"] - out["heldout_base_pass1"]
        return out

    def print_table(self, before: Any, after: Any, trained: list[str], summary: dict) -> None:
        k = self.config.eval.samples
        table = Table(title=f"held-out pass@1 per domain (eval split), before -> after {self.config.steps} steps")
        for col in ("domain", "trained", "before pass@1", f"before pass@{k}", "after pass@1", "delta"):
            if col == "domain":  # never cut a domain name, whatever the terminal's width
                table.add_column(col, no_wrap=True, min_width=max(map(len, before.summary["domains"]), default=6))
            else:
                table.add_column(col, justify="right")
        for name in sorted(set(before.summary["domains"]) | set(after.summary["domains"]), key=lambda n: (n not in trained, n)):
            p0, pk, p1 = _pass(before, name, "pass@1"), _pass(before, name, f"pass@{k}"), _pass(after, name, "pass@1")
            delta = "" if p0 is None or p1 is None else f"{p1 - p0:+.3f}"
            table.add_row(name, "yes" if name in trained else "held out",
                          *("-" if v is None else f"{v:.3f}" for v in (p0, pk, p1)), delta)
        self.console.print(table)
        fmt = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
        self.console.print(
            f"trained domains: pass@1 {fmt(summary['base_pass1'])} -> {fmt(summary['final_pass1'])} "
            f"(base pass@{k} {fmt(summary[f'base_pass{k}'])}); held out: "
            f"{fmt(summary['heldout_base_pass1'])} -> {fmt(summary['heldout_final_pass1'])}; "
            f"training {summary['train_s']}s, total {summary['total_s']}s")
