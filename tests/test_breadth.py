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

    def __init__(self, max_positions: int) -> None:
        self.max_positions = max_positions
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
