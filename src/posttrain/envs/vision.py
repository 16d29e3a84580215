"""Images in environments: what a domain shows, and what a text-only policy gets instead.

A domain that shows images (`Domain.needs_vision`) declares a textual fallback or none. Under
`EnvConfig.text_only` the environment appends the fallback text to the first observation and
drops images from tool outputs (keeping their text); a domain without a fallback cannot be run
by a text-only policy, and `check_text_only` says so before anything runs, naming the domains.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Protocol

from posttrain.envs.base import Observation
from posttrain.envs.budget import EnvConfig
from posttrain.tasks.domain import Domain
from posttrain.values.generation import PolicyVersion
from posttrain.values.task import Task


class Reader(Protocol):
    """What this module reads of a `posttrain.policies.base.Policy` (environments sit below
    policies, so they name the two members rather than import the protocol)."""

    @property
    def version(self) -> PolicyVersion: ...

    @property
    def accepts_images(self) -> bool: ...


class VisionRequired(ValueError):
    """A domain that needs vision met a policy that reads no images."""


def vision_mode(domain: Domain) -> str:
    """'none' (text domain), 'fallback' (images, with a textual fallback) or 'required'."""
    if not domain.needs_vision:
        return "none"
    return "fallback" if domain.text_fallback is not None else "required"


def refused(domains: Sequence[Domain]) -> list[str]:
    """The domains a text-only policy cannot run (they need vision and declare no fallback)."""
    return [d.name for d in domains if vision_mode(d) == "required"]


def check_text_only(domains: Sequence[Domain], policy_name: str = "the policy") -> None:
    """Raise `VisionRequired` naming every domain a text-only policy cannot run."""
    names = refused(domains)
    if names:
        raise VisionRequired(
            f"{policy_name} reads no images, and {len(names)} domain(s) need vision with no textual "
            f"fallback: {', '.join(names[:10])}{' ...' if len(names) > 10 else ''}; use a vision "
            "policy (an image-text model, or an OpenAI-compatible server with --api chat) or leave "
            "these domains out")


def with_task_images(domain: Domain, task: Task, obs: Observation, config: EnvConfig) -> Observation:
    """The first observation with the domain's images (or, text-only, their fallback text)."""
    if domain.images is None:
        return obs
    if config.text_only:
        if domain.text_fallback is None:
            check_text_only([domain])
        assert domain.text_fallback is not None
        return Observation(obs.text + "\n\n" + domain.text_fallback(task), obs.truncated_chars)
    return Observation(obs.text, obs.truncated_chars, images=tuple(domain.images(task)))


def for_policy(config: EnvConfig, policy: Reader, domains: Sequence[Domain]) -> EnvConfig:
    """The environment settings for `policy` over `domains`: text-only when the policy reads no
    images (`Policy.accepts_images`) and a domain shows some; raises `VisionRequired` (naming
    them) for domains that have no textual fallback. Text domains never ask the policy."""
    if config.text_only or not any(d.needs_vision for d in domains) or policy.accepts_images:
        return config
    check_text_only(domains, f"policy {policy.version.name!r}")
    return replace(config, text_only=True)
