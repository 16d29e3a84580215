"""Rounds: a run that starts from another run's checkpoint is the next round of it, and its
forgetting is also reported cumulatively, from the base model to this round.

    posttrain run --name round1
    posttrain run --name round2 --model runs/round1/checkpoints/step-200
    posttrain run --name round3 --model runs/round2/checkpoints/step-200

Each round writes `forgetting/<name>.json` (its own before -> after); round 2 and later also write
`forgetting/<name>-from-base.json`: the first round's `evals/before.json` (the base model) against
this round's `evals/after.json`, with "held out" meaning never trained in *any* round. A drift of
-0.02 a round is invisible to each round's test and -0.06 after three; the cumulative report sees it.

The chain is read back through the run directories themselves: `model.path` in a round's
`config.json` is `<earlier run>/checkpoints/step-N`, whose `config.json` names the round before
it, and so on. A checkpoint copied out of its run directory ends the chain there (the report then
covers the rounds that can be found, and says from which evaluation it starts).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CUMULATIVE_SUFFIX = "-from-base"


@dataclass(frozen=True)
class Round:
    run_dir: Path
    name: str
    trained: tuple[str, ...]
    """the domains it trained (its own forgetting report's `trained_domains`); empty if unknown"""


def _run_of_checkpoint(model_path: str | Path) -> Path | None:
    """The run directory a checkpoint path belongs to (`RUN/checkpoints/step-N`), or None."""
    p = Path(model_path)
    run = p.parent.parent
    if p.parent.name != "checkpoints" or not (run / "config.json").is_file():
        return None
    return run


def _config(run: Path) -> dict[str, Any]:
    try:
        data = json.loads((run / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{run / 'config.json'}: unreadable ({e})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{run / 'config.json'}: expected a JSON object")
    return data


def _trained(run: Path, name: str) -> tuple[str, ...]:
    from posttrain.evaluation.forgetting import FORGETTING_DIR
    from posttrain.evaluation.result import safe_name

    try:
        data = json.loads((run / FORGETTING_DIR / f"{safe_name(name)}.json").read_text())
        return tuple(str(d) for d in data.get("trained_domains") or ())
    except (OSError, json.JSONDecodeError, AttributeError):
        return ()


def earlier_rounds(model_path: str | Path) -> list[Round]:
    """The rounds before a run that starts from `model_path`, the first (base) round first; []
    when the model is not a checkpoint of a run directory."""
    chain: list[Round] = []
    seen: set[Path] = set()
    run = _run_of_checkpoint(model_path)
    while run is not None and run.resolve() not in seen:  # a loop of copied directories ends too
        seen.add(run.resolve())
        cfg = _config(run)
        name = str(cfg.get("name") or run.name)
        chain.append(Round(run, name, _trained(run, name)))
        model = cfg.get("model", {}).get("path") if isinstance(cfg.get("model"), dict) else None
        run = _run_of_checkpoint(model) if model else None
    return chain[::-1]


def cumulative_forgetting(earlier: list[Round], name: str, after: Any, trained: list[str]) -> dict[str, Any] | None:
    """The forgetting report from the first round's `evals/before.json` to `after` (this round's
    evaluation), held out = trained in no round; None when there is no earlier round. A base
    evaluation that cannot be read raises ValueError naming the file."""
    from posttrain.evaluation import forgetting_report
    from posttrain.evaluation.result import EVALS_DIR, EvalResult

    if not earlier:
        return None
    first = earlier[0]
    base = EvalResult.load(first.run_dir / EVALS_DIR / "before.json")
    every = sorted({d for r in earlier for d in r.trained} | set(trained))
    report = forgetting_report(base, after, every)
    report.update(before=f"{first.name}/{base.name}", after=f"{name}/{after.name}", cumulative=True,
                  rounds=[r.name for r in earlier] + [name],
                  base_eval=str(first.run_dir / EVALS_DIR / "before.json"),
                  rounds_without_trained_domains=[r.name for r in earlier if not r.trained])
    return report
