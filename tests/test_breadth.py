"""Many domains in one run: domains that do not fit the model are named once and left out (or
refused), and every registered domain can be selected for training."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from posttrain.pipeline import checks
from posttrain.pipeline.config import ConfigError
from posttrain.tasks.registry import get_domain


class CharPolicy:
    """A policy whose 'tokens' are characters, with a small context."""

    def __init__(self, max_positions: int, accepts_images: bool = False) -> None:
        self.max_positions = max_positions
        self.accepts_images = accepts_images
        self.version = SimpleNamespace(name="chars")

    def render(self, request):
        return list("".join(m.content for m in request.messages))


def test_unfit_domains_are_refused_or_left_out_once(capsys):
    from rich.console import Console

    short, long_ = get_domain("math.add.d1"), get_domain("code.list.chunk")
    evals = checks.eval_tasks([short, long_], 2)
    policy = CharPolicy(200)  # a math prompt fits in 200 characters, a code prompt does not
    with pytest.raises(ConfigError) as e:
        checks.check_context(policy, [short, long_], evals)
    assert "code.list.chunk (domains.train)" in str(e.value) and "--skip-unfit" in str(e.value)
    assert "math.add.d1" not in str(e.value)
    console = Console(width=200)
    assert checks.check_context(policy, [short, long_], evals, skip=True, console=console) == {"code.list.chunk"}
    out = capsys.readouterr().out
    assert out.count("code.list.chunk (domains.train)") == 1 and "left out (--skip-unfit)" in out
    assert checks.check_context(CharPolicy(10_000), [short, long_], evals) == set()


def test_a_text_policy_is_measured_with_the_text_that_stands_in_for_images():
    # docs.page shows statement pages as images; a text-only policy gets them as text (most of
    # its prompt): the smoke run of configs/breadth-agent.toml found these prompts measured
    # without it, and every episode an infra_error ("prompt of 1769 tokens does not fit")
    page = get_domain("docs.page.balance-totals")
    task = page.task(0, "train")
    with_text = len(task.prompt) + len(page.text_fallback(task))
    assert len(task.prompt) < 1000 < with_text
    assert checks.unfit_domains(CharPolicy(1000), [page], [], per_domain=1) == {
        "docs.page.balance-totals": (pytest.approx(with_text, abs=10), task.key)}
    assert checks.unfit_domains(CharPolicy(1000, accepts_images=True), [page], [], per_domain=1) == {}


@pytest.mark.slow
def test_eval_baseline_gates_the_run(tmp_path):
    """`[eval] baseline = FILE`: the trained policy is compared with the baseline's frozen verdicts
    and a significant regression makes the run exit 1 (an oracle's verdicts: the tiny model
    regresses against them on every task)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root / "src")}

    def posttrain(*args):
        return subprocess.run([sys.executable, "-m", "posttrain.cli", *args], capture_output=True, text=True,
                              env=env, cwd=root, timeout=600)

    base = tmp_path / "base.json"
    p = posttrain("eval", "baseline", "create", "--policy", "oracle", "--tasks", "math.add.d1",
                  "--size", "30", "--out", str(base))
    assert p.returncode == 0, p.stderr[-2000:]
    cfg = tmp_path / "g.toml"
    cfg.write_text(f'name = "g"\nruns_dir = "{tmp_path / "runs"}"\nsteps = 1\n[domains]\ntrain = ["math.add.d1"]\n'
                   f'heldout = []\n[rollout]\ngroup_size = 2\ngroups_per_step = 2\n'
                   f'[eval]\ntasks_per_domain = 2\nsamples = 1\nbaseline = "{base}"\n')
    p = posttrain("run", str(cfg), "--json")
    assert p.returncode == 1, p.stderr[-3000:]
    assert "significant regression against" in p.stderr
    summary = json.loads((tmp_path / "runs" / "g" / "summary.json").read_text())
    assert summary["gate"]["passed"] is False and summary["gate"]["regressions"]
    assert (tmp_path / "runs" / "g" / "evals" / "gate.json").is_file()
    cfg.write_text(cfg.read_text().replace(str(base), str(tmp_path / "nope.json")).replace('"g"', '"h"'))
    p = posttrain("run", str(cfg))
    assert p.returncode == 2 and "eval.baseline" in p.stderr, p.stderr[-2000:]
