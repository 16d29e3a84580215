"""The sampler's view of the trainer's weights.

With a staleness bound of 0 the scheduler never generates while the trainer updates, so the
sampler can share the trained module. With a bound above 0 generation overlaps training: the
sampler then keeps its own copy of the weights, refreshed after each trainer step under a lock
that no generation call holds (a batch never mixes two versions).
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from posttrain.values.generation import Completion, GenerationRequest, PolicyVersion

if TYPE_CHECKING:
    from posttrain.training.trainer import Trainer


class SyncedPolicy:
    def __init__(self, trainer: Trainer, *, copy: bool) -> None:
        self.trainer = trainer
        self.copy = copy
        self._lock = threading.Lock()
        self._policy = self._make()

    def _make(self) -> Any:
        from posttrain.policies.local import TorchPolicy

        if not self.copy:
            return self.trainer.policy()
        model = copy.deepcopy(self.trainer.model).eval()
        return TorchPolicy(model, self.trainer.tokenizer, version=self.trainer.version)

    @property
    def version(self) -> PolicyVersion:
        return self._policy.version

    @property
    def max_positions(self) -> int | None:
        return self._policy.max_positions

    def render(self, request: GenerationRequest) -> list[int] | None:
        return self._policy.render(request)

    def sync(self) -> None:
        """Take the trainer's current weights (call after each trainer step)."""
        with self._lock:
            if self.copy:
                self._policy.model.load_state_dict(self.trainer.model.state_dict())
                self._policy.version = self.trainer.version
            else:
                self._policy = self.trainer.policy()

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        with self._lock:
            return self._policy.generate(requests)
