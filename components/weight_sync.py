"""Weight sync: a versioned channel from the learner to inference owners and collectors.

``push(module)`` publishes a new version; receivers apply it in place between their batches; versions are
monotonic. In ``direct`` placement receivers share the process, so a push applies to every attached
receiver before it returns.
"""

from __future__ import annotations

import threading
from typing import Mapping, Protocol

import torch
from torch import nn

from .service import Owner


class WeightReceiver(Protocol):
    def load_weights(self, state: Mapping[str, torch.Tensor], version: int) -> None: ...


class WeightSync(Owner["WeightSync"]):
    """A versioned weight channel.

    Args:
        placement: where the channel lives; ``None`` takes the ``service_backend`` context, else ``direct``.
        transport: transport kind; ``None`` takes the ``transport_backend`` context, else ``auto``.

    Example:
        >>> sync = WeightSync().start()
        >>> server = InferenceServer(policy_factory=make_policy, weight_sync=sync).start()
        >>> sync.push(learner)
        1
    """

    component = "weight_sync"

    def __init__(self, *, placement: str | None = None, transport=None):
        super().__init__(placement=placement, transport=transport)
        self._version = 0
        self._receivers: list[WeightReceiver] = []
        self._latest: dict[str, torch.Tensor] | None = None
        self._lock = threading.Lock()

    def _shutdown(self, timeout: float | None) -> None:
        with self._lock:
            self._receivers.clear()
            self._latest = None

    # ------------------------------------------------------------------ receivers
    def attach(self, receiver: WeightReceiver) -> None:
        """Register a receiver; it gets the latest version now (if any) and every later push."""
        with self._lock:
            self._receivers.append(receiver)
            latest, version = self._latest, self._version
        if latest is not None:
            receiver.load_weights(latest, version)

    def detach(self, receiver: WeightReceiver) -> None:
        with self._lock:
            self._receivers = [r for r in self._receivers if r is not receiver]

    # ------------------------------------------------------------------ domain operations
    @property
    def version(self) -> int:
        """The latest published version (0 before the first push)."""
        return self._version

    def push(self, weights: nn.Module | Mapping[str, torch.Tensor]) -> int:
        """Publish ``weights`` as a new version and apply it to every receiver.

        Returns:
            The new version.
        """
        self._require_running()
        state = weights.state_dict() if isinstance(weights, nn.Module) else dict(weights)
        with self._lock:
            self._version += 1
            version = self._version
            self._latest = state
            receivers = list(self._receivers)
        for receiver in receivers:
            receiver.load_weights(state, version)
        return version

    def pull(self) -> tuple[int, Mapping[str, torch.Tensor] | None]:
        """The latest ``(version, state_dict)``; the state is ``None`` before the first push."""
        with self._lock:
            return self._version, self._latest
