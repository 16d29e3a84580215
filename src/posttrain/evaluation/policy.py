"""Which policy `--policy MODEL_OR_VERSION` means, and fixed per-sample seeds.

`resolve_policy(spec, run_dir=None)` accepts, in this order:

1. `oracle`, `empty`, `wrong` (or any negative name, or `scripted:NAME`): a scripted policy that
   plays each task's oracle or negative -- no model, for smoke runs and tests;
2. `openai:BASE_URL#MODEL` (e.g. `openai:http://127.0.0.1:8000/v1#tiny`): an OpenAI-compatible
   server (vLLM, SGLang, `posttrain.policies.serve`) through `OpenAIPolicy` and its completions
   API; `openai-chat:BASE_URL#MODEL` uses the chat API (the server applies its chat template);
3. a directory holding a Hugging Face causal LM (`config.json`): `TorchPolicy` in-process;
4. a policy version name recorded in the run store of `run_dir` (`policy_versions.path`): that
   checkpoint directory, loaded as in 3.

Heavy backends are imported only when chosen.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from posttrain.policies.base import Policy
from posttrain.values.generation import Completion, GenerationRequest

SCRIPTED = ("oracle", "empty", "wrong")


class PolicySpecError(ValueError):
    """A --policy value that names nothing we can load; says what was tried."""


def _torch_policy(path: Path, mode: str = "standard") -> Policy:
    from transformers.utils import logging as hf_logging

    from posttrain.policies.local import TorchPolicy

    hf_logging.disable_progress_bar()  # the evaluation's own display says what is happening
    return TorchPolicy(str(path), mode=mode)


def _openai_policy(spec: str) -> Policy:
    scheme, _, rest = spec.partition(":")
    url, sep, model = rest.partition("#")
    if not url or not sep or not model:
        raise PolicySpecError(f"--policy {spec!r}: expected '{scheme}:BASE_URL#MODEL', e.g. "
                              f"'{scheme}:http://127.0.0.1:8000/v1#tiny'")
    from posttrain.policies.openai_compat import OpenAIConfig, OpenAIPolicy

    try:
        config = OpenAIConfig(base_url=url, model=model, api="chat" if scheme == "openai-chat" else "completions")
    except ValueError as e:
        raise PolicySpecError(f"--policy {spec!r}: {e}") from None
    return OpenAIPolicy(config)


def resolve_policy(spec: str, run_dir: str | Path | None = None, mode: str = "standard") -> Policy:
    """The policy `spec` names (see the module docstring); raises PolicySpecError otherwise.
    `mode` ('standard' or 'fast': speculative decoding, `TorchPolicy`) applies to model
    directories and policy versions; other policies only take 'standard'."""
    from posttrain.policies.scripted import ScriptedPolicy

    spec = spec.strip()
    if not spec:
        raise PolicySpecError("--policy is empty")
    if mode not in ("standard", "fast"):
        raise PolicySpecError(f"--mode {mode!r}: expected 'standard' or 'fast'")
    if mode != "standard" and (spec in SCRIPTED or spec.startswith(("scripted:", "openai:", "openai-chat:"))):
        raise PolicySpecError(f"--mode {mode} needs a model directory or policy version (TorchPolicy), "
                              f"not {spec!r}")
    if spec in SCRIPTED or spec.startswith("scripted:"):
        return ScriptedPolicy.named(spec.removeprefix("scripted:"))
    if spec.startswith(("openai:", "openai-chat:")):
        return _openai_policy(spec)
    path = Path(spec)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise PolicySpecError(f"--policy {spec}: the directory has no config.json (not a Hugging "
                                  "Face model directory)")
        return _torch_policy(path, mode)
    tried = ["scripted names (oracle, empty, wrong)", "openai:URL#MODEL", "a model directory (config.json)"]
    if run_dir is not None:
        from posttrain.storage.store import Store, StoreError

        try:
            with Store.for_run_dir(run_dir, readonly=True) as store:
                versions = {v["name"]: v for v in store.policy_versions()}
        except StoreError as e:
            raise PolicySpecError(f"--policy {spec}: cannot read policy versions of {run_dir}: {e}") from None
        if spec in versions:
            ckpt = versions[spec].get("path")
            if not ckpt or not Path(ckpt).is_dir():
                raise PolicySpecError(f"--policy {spec}: policy version found in {run_dir}, but its "
                                      f"checkpoint path {ckpt!r} is not a directory")
            return _torch_policy(Path(ckpt), mode)
        known = ", ".join(sorted(versions)[:10]) or "none"
        tried.append(f"a policy version of {run_dir} (it has: {known})")
    else:
        tried.append("a policy version name (needs --run-dir)")
    raise PolicySpecError(f"--policy {spec!r} names nothing loadable; tried " + "; ".join(tried))


def sample_seed(base_seed: int, group_id: str, turn: int) -> int:
    """The sampling seed of one turn of one eval sample: a hash, so it does not depend on
    batch composition or on which other tasks are in the set."""
    digest = hashlib.sha256(f"{base_seed}:{group_id}:{turn}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


class SeededPolicy:
    """Wraps a policy: every request gets `sample_seed(base, group_id, turn)` as its seed.

    The eval runner gives sample j of task h the group id 'eval:<h>:<j>', so sample j of a task
    is drawn with the same seed by every run and by both sides of an A/B comparison (backends
    that ignore seeds, e.g. scripted ones, are unaffected)."""

    def __init__(self, policy: Policy, base_seed: int) -> None:
        self.inner = policy
        self.base_seed = base_seed
        self.version = policy.version

    @property
    def max_positions(self) -> int | None:
        return self.inner.max_positions

    @property
    def accepts_images(self) -> bool:
        return self.inner.accepts_images

    def render(self, request: GenerationRequest) -> list[int] | None:
        return self.inner.render(request)

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        seeded = [replace(r, sampling=replace(r.sampling, seed=sample_seed(
            self.base_seed, str(r.meta.get("group_id", r.request_id)), int(r.meta.get("turn", 0)))))
            for r in requests]
        return self.inner.generate(seeded)
