"""What the job checks before it starts: the task sets, contamination, and context fit.

* `eval_tasks`: the eval split of the trained and held-out domains (one entry per distinct task);
* `check_contamination`: refuse to start when eval tasks leak into the training distribution
  (`contamination.json`; `allow_contamination = true` overrides, and the override is recorded);
* `check_context`: refuse to start when a domain's prompts do not fit the model's context.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console

from posttrain.envs import EnvConfig, initial_observation
from posttrain.evaluation.contamination import CONTAMINATION_FILE, ContaminationConfig, guard_training
from posttrain.evaluation.contamination import check_contamination as _contamination
from posttrain.pipeline.config import ConfigError
from posttrain.policies.base import Policy
from posttrain.tasks.domain import Domain, NoTasksInSplit
from posttrain.values.generation import GenerationRequest, Message, SamplingParams
from posttrain.values.task import Task


def has_split(domain: Domain, split: str) -> bool:
    try:
        domain.task(0, split)  # type: ignore[arg-type]
    except NoTasksInSplit:
        return False
    return True


def eval_tasks(domains: Sequence[Domain], per_domain: int, start: int = 0) -> list[tuple[Domain, Task]]:
    """Each domain's eval tasks of seeds `start`..`start + per_domain - 1` (a task met twice kept once)."""
    out, seen = [], set()
    for d in domains:
        if not has_split(d, "eval"):
            continue  # an imported single task that lives in the train split only
        for seed in range(start, start + per_domain):
            task = d.task(seed, "eval")
            if task.hash not in seen:
                seen.add(task.hash)
                out.append((d, task))
    return out


def train_sample(train_domains: Sequence[Domain], per_domain: int) -> list[Task]:
    """The training tasks the contamination check compares eval tasks with: the first
    `per_domain` (at most 2,000) of each domain's train split."""
    return [d.task(seed, "train") for d in train_domains for seed in range(min(per_domain, 2000))]


def contamination_key(train_domains: Sequence[Domain], evals: Sequence[tuple[Domain, Task]],
                      per_domain: int) -> str:
    """What a contamination check compared, cheaply: every eval task's hash, and per trained
    domain its name, how many training tasks were sampled and the hash of its first one (the
    sample is the first `per_domain` tasks of a seeded generator: the same generator gives the
    same sample, and a changed one changes its first task too, short of a change that spares
    task 0). Building the sample itself is the slow half of the check (~3 min for 330 domains)."""
    h = hashlib.sha256(json.dumps(ContaminationConfig().__dict__, sort_keys=True, default=str).encode())
    for d, t in evals:
        h.update(f"eval {d.name} {t.hash}\n".encode())
    for d in train_domains:
        h.update(f"train {d.name} {min(per_domain, 2000)} {d.task(0, 'train').hash}\n".encode())
    return h.hexdigest()


def check_contamination(train_domains: Sequence[Domain], evals: Sequence[tuple[Domain, Task]], *,
                        per_domain: int, run_dir: Path, allow: bool, console: Console) -> None:
    """Compare the eval tasks with the training sample (`train_sample`) and record it in
    `contamination.json`; refuse a leak unless `allow`. A resumed run whose recorded check covered
    the same tasks (`contamination_key`) and did not refuse is not checked again."""
    key = contamination_key(train_domains, evals, per_domain)
    recorded = _recorded_check(run_dir / CONTAMINATION_FILE)
    if recorded.get("key") == key and not recorded.get("refused"):
        console.print("contamination: checked when the run started, on the same tasks (contamination.json)")
        overlaps = len(recorded.get("matches") or [])
    else:
        report = _contamination(train_sample(train_domains, per_domain), [t for _, t in evals])
        guard_training(report, run_dir, allow=allow, key=key)
        overlaps = len(report.matches)
    if overlaps:
        console.print(f"[yellow]contamination: {overlaps} eval tasks overlap the training sample; allowed by "
                      "the config (recorded in contamination.json)")


def _recorded_check(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}  # none yet, or torn: check again
    return data if isinstance(data, dict) else {}


def unfit_domains(policy: Policy, train_domains: Sequence[Domain], evals: Sequence[tuple[Domain, Task]],
                  per_domain: int = 4) -> dict[str, tuple[int, str]]:
    """Domains whose prompts do not fit the model's context: name -> (the longest prompt's
    tokens, its task key). Looks at the first `per_domain` train tasks of each trained domain and
    at the eval tasks; empty when the backend cannot say (no context limit or no tokenizer)."""
    limit = policy.max_positions
    if limit is None:
        return {}  # the backend does not say (a server checks on its own)
    tasks = [(d, d.task(seed, "train")) for d in train_domains for seed in range(per_domain)]
    # a policy that reads no images gets the text that stands in for them, as episodes do
    config = EnvConfig(text_only=not policy.accepts_images)
    worst: dict[str, tuple[int, str]] = {}
    for d, task in tasks + list(evals):
        if d.name in worst:
            continue  # one prompt that does not fit is enough to leave the domain out
        text = initial_observation(d, task, config)
        ids = policy.render(GenerationRequest((Message("user", text),), SamplingParams()))
        if ids is None:
            return {}  # no tokenizer to measure with
        if len(ids) >= limit:
            worst[d.name] = (len(ids), task.key)
    return worst


def check_context(policy: Policy, train_domains: Sequence[Domain], evals: Sequence[tuple[Domain, Task]],
                  per_domain: int = 4, *, skip: bool = False, console: Console | None = None) -> set[str]:
    """Refuse to start when a domain's prompts do not fit the model's context: such an episode
    can never run (it is not an infrastructure failure that a retry would cure). With `skip`,
    say once which domains are left out and return their names instead."""
    worst = unfit_domains(policy, train_domains, evals, per_domain)
    if not worst:
        return set()
    limit = policy.max_positions
    trained = {d.name for d in train_domains}
    lines = [f"  {name} ({'domains.train' if name in trained else 'domains.heldout'}): "
             f"{n} prompt tokens (task {key})" for name, (n, key) in sorted(worst.items())]
    head = (f"{len(worst)} domain(s) have prompts that do not fit the model's context of {limit} "
            f"positions ({policy.version.name}), leaving no room to answer")
    if skip:
        if console is not None:
            console.print(f"[yellow]{head}; left out (--skip-unfit):\n" + "\n".join(lines))
        return set(worst)
    raise ConfigError(head + ":\n" + "\n".join(lines) + "\nRemove them from the config, leave them "
                      "out with --skip-unfit ([domains] skip_unfit = true), or use a model with a "
                      "longer context.")
