"""Checkpoint -> kill -> resume continues exactly like an uninterrupted run.

The run samples its own data (global torch RNG, through the episode runner and a real domain's
verifier), so the resumed run only matches if weights, optimizer, RNG states, step and cursor all
came back. The run is also a script (`python -m tests.test_training_checkpoint fresh DIR`), so
that one copy of it can be killed with SIGKILL in the middle of a step; the resumed and the
uninterrupted runs then go on in the test's own process (with the same thread count).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "models" / "tiny-base"
STEPS = 4


def run(trainer, out: Path, total: int) -> str:
    """Train to `total` steps, checkpointing after each; returns the final weights hash."""
    from posttrain.scheduling.engine import WorkItem, run_episodes
    from posttrain.tasks.registry import get_domain
    from posttrain.values.generation import SamplingParams

    domain = get_domain("math.add.d2")
    while trainer.step_count < total:
        cursor = trainer.data_cursor  # the data position comes back from the checkpoint
        specs = [WorkItem(domain, domain.task(cursor + i, "train"), group_id=str(cursor + i))
                 for i in range(4) for _ in range(6)]
        trajectories = run_episodes(specs, trainer.policy(), SamplingParams(temperature=1.0, max_tokens=5),
                                    workers=1)
        groups: dict[str, list] = {}
        for t in trajectories:
            groups.setdefault(t.group_id, []).append(t)
        trainer.step(list(groups.values()))
        trainer.save(out / f"step-{trainer.step_count}", extra={"note": f"after step {trainer.step_count}"})
        print(f"saved {trainer.step_count}", flush=True)
    return trainer.version.weights_hash


def main(argv: list[str]) -> None:
    """`fresh DIR`: the run that the test kills."""
    from posttrain.training.config import TrainerConfig
    from posttrain.training.trainer import Trainer

    torch.set_num_threads(1)
    assert argv[0] == "fresh", argv
    run(Trainer(MODEL, TrainerConfig(lr=2e-3, micro_batch_size=16, run_name="r")), Path(argv[1]), STEPS)


@pytest.mark.slow
def test_killed_run_resumes_to_the_same_weights(tmp_path):
    from posttrain.training.config import TrainerConfig
    from posttrain.training.trainer import Trainer

    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, "-m", "tests.test_training_checkpoint"]
    killed = subprocess.Popen(cmd + ["fresh", str(tmp_path / "a")], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert killed.stdout is not None
    for line in killed.stdout:
        if line.strip() == "saved 2":
            killed.send_signal(signal.SIGKILL)  # in the middle of step 3
            break
    killed.wait()
    assert killed.returncode == -signal.SIGKILL
    # whatever the kill interrupted, no checkpoint directory is half-written
    for d in (tmp_path / "a").iterdir():
        if not d.name.startswith("."):
            assert (d / "trainer_state.json").is_file() and (d / "model.safetensors").is_file()

    torch.set_num_threads(1)  # as in the killed process: same numerics
    resumed = Trainer.resume(tmp_path / "a" / "step-2")
    assert resumed.step_count == 2 and resumed.data_cursor == 8
    resumed_hash = run(resumed, tmp_path / "a", STEPS)

    straight = Trainer(MODEL, TrainerConfig(lr=2e-3, micro_batch_size=16, run_name="r"))
    assert run(straight, tmp_path / "b", STEPS) == resumed_hash

    again = Trainer.resume(tmp_path / "a" / f"step-{STEPS}")
    assert again.step_count == STEPS and again.data_cursor == 4 * STEPS
    assert again.extra == {"note": f"after step {STEPS}"}
    assert again.version.name == f"r/step-{STEPS}"


if __name__ == "__main__":
    main(sys.argv[1:])
