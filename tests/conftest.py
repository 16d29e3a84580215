"""Fixtures shared by many test files: a warm sandbox reset between tests, the shipped tiny
model as a policy, a tiny BPE model, and a registry with extra domains for one test.

Test tiers: tests marked `slow` (a full job, a live server, a sandboxed family sweep) are part of
the default run; `pytest -m "not slow" -n 2` leaves them out for a quick check, on two processes
(pytest-xdist): a test must not depend on another's side effects or on running alone (its own
`tmp_path`, free ports, its own sandboxes).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "models" / "tiny-base"
"""the shipped base model"""

if sys.dont_write_bytecode:
    # PYTHONDONTWRITEBYTECODE (set in some shells) makes every test process compile the package
    # and parse and rewrite the asserts of every test module again: half of collection's CPU,
    # paid by each xdist worker, and a CLI subprocess compiles the package again each time. The
    # tests and the Python processes they start keep their compiled files under .pytest_cache
    # instead (out of the source tree, as the setting wants; ignored by git).
    sys.dont_write_bytecode = False
    sys.pycache_prefix = str(ROOT / ".pytest_cache" / "pycache")
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    os.environ["PYTHONPYCACHEPREFIX"] = sys.pycache_prefix


@pytest.fixture(scope="module")
def module_sandbox(request) -> Iterator[tuple]:
    """One sandbox per test module and a snapshot of its empty workspace. A module may set
    `SANDBOX_PRELOAD` (module names) to warm its sandbox's Python with heavy imports."""
    from posttrain.sandbox import open_sandbox

    preload = tuple(getattr(request.module, "SANDBOX_PRELOAD", ()))
    with open_sandbox(preload=preload) as sb:
        yield sb, sb.snapshot()


@pytest.fixture
def sandbox(module_sandbox):
    """The module's sandbox with an empty workspace again."""
    sb, clean = module_sandbox
    sb.restore(clean)
    return sb


@pytest.fixture(scope="session")
def tiny_policy():
    """`TorchPolicy` on the shipped tiny model, on one CPU thread (shared: tests must not change
    its weights or settings)."""
    import torch

    from posttrain.policies.local import TorchPolicy

    torch.set_num_threads(1)
    return TorchPolicy(MODEL, device="cpu")


@pytest.fixture(scope="session")
def bpe_model_dir(tmp_path_factory) -> Path:
    """A randomly initialised GPT-2 with a small byte-level BPE (`test_token_in_out.bpe_dir`),
    built once per test process (tests only read it)."""
    from tests.test_token_in_out import bpe_dir

    return bpe_dir(tmp_path_factory.mktemp("bpe"))


@pytest.fixture
def toy_registry(monkeypatch) -> Callable[..., None]:
    """Returns a function that adds domains to the registry for the duration of a test."""
    from posttrain.tasks import registry

    def add(*domains) -> None:
        current = dict(registry.all_domains())
        current.update({d.name: d for d in domains})
        monkeypatch.setattr(registry, "_domains", current)
    return add
