"""configs/breadth-agent.toml: the breadth run with tiny-agent, every family trained."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

from posttrain.pipeline import checks, mix
from posttrain.pipeline.config import load_config

ROOT = Path(__file__).resolve().parents[1]


def test_breadth_agent_config_trains_everything_with_tiny_agent(tmp_path):
    cfg = load_config(ROOT / "configs" / "breadth-agent.toml", {"runs_dir": str(tmp_path)})
    base = load_config(ROOT / "configs" / "breadth.toml", {"runs_dir": str(tmp_path)})
    assert Path(cfg.model.path).name == "tiny-agent"
    assert list(cfg.domains.train) == ["*"] and cfg.domains.skip_unfit
    assert cfg.domains.heldout == base.domains.heldout  # forgetting measured as in breadth.toml
    assert cfg.scheduler.workers == 8
    assert cfg.trainer.replay_solved == 4  # solved domains replayed (README: the breadth run with replay)
    # README: holding the domains a step does not sample
    assert cfg.trainer.kl_anchor_domains == 64 and cfg.trainer.kl_beta > 0
    assert cfg.trainer.kl_anchor_weight == 2


@pytest.mark.slow
def test_tiny_agent_fits_every_family(tmp_path):
    # the point of the config: with 1,024 positions the sandboxed families are trained, not left out
    from posttrain.pipeline.main import Job
    from posttrain.policies.local import TorchPolicy

    cfg = load_config(ROOT / "configs" / "breadth-agent.toml",
                      {"runs_dir": str(tmp_path), "model.path": str(ROOT / "models" / "tiny-agent")})
    job = Job(cfg, Console(quiet=True))
    policy = TorchPolicy(cfg.model.path)
    unfit = checks.unfit_domains(policy, job.train_domains, [], per_domain=2)
    fits = [d for d in job.train_domains if d.name not in unfit]
    assert len(fits) >= 300
    assert {d.family for d in fits} >= {"math", "text", "code", "terminal", "geometry", "docs", "rg"}
    specs = {s.name: s for s in mix.domain_specs(cfg, fits, left_out=unfit)}
    sandboxed = [s for s in specs.values() if s.sandboxed]
    assert sandboxed and all(s.max_concurrency == 4 for s in sandboxed if s.name.split(".")[0]
                             in ("code", "terminal", "geometry"))
    assert all(s.max_concurrency is None for s in specs.values() if not s.sandboxed)
