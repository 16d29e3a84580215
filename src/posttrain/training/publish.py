"""Weight publishing: the one place where the current policy version moves.

The trainer owns the version (`Trainer.version`: '<run>/step-<n>', from its step count). After
each step `PolicyPublisher.publish()` hands the new weights to the sampler and the new version to
whoever numbers generations (the scheduler's staleness counter and version name), in one call,
and checks that they agree: the scheduler's version number must equal the trainer's step count.
Nothing else sets a version, so the three can no longer drift apart by call order.

With a staleness bound of 0 the scheduler never generates while the trainer updates, so the
sampler can share the trained module. With a bound above 0 generation overlaps training: the
sampler then keeps its own copy of the weights, refreshed under a lock that no generation call
holds (a batch never mixes two versions).

A trainer of an image-text-to-text model publishes a `VisionPolicy` the same way (its copy shares
the processor).
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from posttrain.policies.local import TorchPolicy
from posttrain.policies.vision import VisionPolicy
from posttrain.values.generation import Completion, GenerationRequest, PolicyVersion

if TYPE_CHECKING:
    from posttrain.training.trainer import Trainer

def current_policy(trainer: Trainer, mode: str = "standard") -> TorchPolicy | VisionPolicy:
    """The trainer's current weights as a policy, whichever kind it trains: `Trainer.policy()`
    for a text model, `Trainer.vision_policy()` for an image-text-to-text one (which decodes in
    the standard mode only: it has no drafter and no prefix cache)."""
    if trainer.vision is None:
        return trainer.policy(mode=mode)
    _standard_only(mode)
    return trainer.vision_policy()


def _standard_only(mode: str) -> None:
    if mode != "standard":
        raise ValueError(f"mode {mode!r}: an image-text-to-text model decodes in the 'standard' mode only")


VersionListener = Callable[[str], int]
"""told a new version's name; returns its own number for that version (checked against the step)"""


class VersionMismatch(RuntimeError):
    """A listener numbered the new version differently from the trainer's step count."""


class PolicyPublisher:
    def __init__(self, trainer: Trainer, *, copy: bool, mode: str = "standard") -> None:
        self.trainer = trainer
        self.copy = copy
        self.mode = mode
        """'standard' or 'fast' (`TorchPolicy` modes: speculative decoding and a prefix cache,
        which empties itself when the weights change)"""
        self._lock = threading.Lock()
        self._listeners: list[VersionListener] = []
        self._policy = self._make()

    def _make(self) -> TorchPolicy | VisionPolicy:
        if not self.copy:
            return current_policy(self.trainer, self.mode)
        vision = self.trainer.vision
        if vision is not None:
            _standard_only(self.mode)
        model = copy.deepcopy(self.trainer.model).eval()
        if vision is not None:  # the processor is read-only: the copy shares it
            return VisionPolicy(model, vision.processor, version=self.trainer.version, image_token=vision.image_token)
        return TorchPolicy(model, self.trainer.tokenizer, version=self.trainer.version, mode=self.mode)

    def subscribe(self, listener: VersionListener) -> None:
        """`listener(name)` is called by every `publish()` (e.g. `Scheduler.set_policy_version`)."""
        self._listeners.append(listener)

    @property
    def version(self) -> PolicyVersion:
        """The version the sampler generates with."""
        return self._policy.version

    @property
    def max_positions(self) -> int | None:
        return self._policy.max_positions

    @property
    def accepts_images(self) -> bool:
        return self._policy.accepts_images

    def render(self, request: GenerationRequest) -> list[int] | None:
        return self._policy.render(request)

    def publish(self) -> PolicyVersion:
        """Take the trainer's current weights (call after each trainer step) and announce them."""
        version = self.trainer.version
        with self._lock:
            if self.copy:
                self._policy.model.load_state_dict(self.trainer.model.state_dict())
                self._policy.version = version
            else:
                self._policy = current_policy(self.trainer, self.mode)
        for listener in self._listeners:
            number = listener(version.name)
            if number != self.trainer.step_count:
                raise VersionMismatch(f"{version.name}: a listener numbers it {number}, the trainer "
                                      f"is at step {self.trainer.step_count}")
        return version

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        with self._lock:
            return self._policy.generate(requests)
