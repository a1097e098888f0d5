"""The inference service: one policy, many callers.

``InferenceServer`` owns the behaviour policy, its device and its weights, and stamps every answer with
``policy_version``. In ``direct`` placement there is no server thread: the client is the owner and a call is
one forward pass in the caller's thread.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Any, Callable, Mapping

import torch
from tensordict import TensorDictBase
from torch import nn

from transports.errors import ConfigurationError

from ..service import Owner
from .config import InferenceDeviceConfig, InferenceServerConfig


class InferenceServer(Owner["InferenceServer"]):
    """Auto-batching policy server.

    Args:
        policy: a TensorDict module (reads ``observation``, writes ``action`` and friends). Mutually
            exclusive with ``policy_factory``.
        policy_factory: a picklable callable returning the policy, called where the owner lives.
        config: execution and batching settings (:class:`InferenceServerConfig`).
        device_config: devices (:class:`InferenceDeviceConfig`).
        transport: a transport kind or config; ``None`` takes the ``transport_backend`` context or ``auto``.
        weight_sync: a weight-sync owner or client whose pushed versions this server applies between batches.
        request_layout: the wire layout of one request, when known (fixed-layout transports need it).

    Example:
        >>> server = InferenceServer(policy_factory=make_policy).start()
        >>> td = server.client()(TensorDict({"observation": obs}, [8]))
        >>> td["action"].shape, int(td["policy_version"])
        (torch.Size([8]), 0)
        >>> server.shutdown()
    """

    component = "inference"

    def __init__(
        self,
        policy: nn.Module | None = None,
        *,
        policy_factory: Callable[[], nn.Module] | None = None,
        config: InferenceServerConfig | None = None,
        device_config: InferenceDeviceConfig | None = None,
        transport: Any = None,
        weight_sync: Any = None,
        request_layout: Any = None,
    ):
        if (policy is None) == (policy_factory is None):
            raise ConfigurationError("InferenceServer needs exactly one of policy or policy_factory")
        self.config = config or InferenceServerConfig()
        self.device_config = device_config or InferenceDeviceConfig()
        super().__init__(placement=self.config.placement, transport=transport, layouts_known=request_layout is not None)
        self._policy = policy
        self._policy_factory = policy_factory
        self._weight_sync = weight_sync
        self.request_layout = request_layout
        self._version = 0
        self._lock = threading.Lock()
        self._device = torch.device(self.device_config.policy_device)

    # ------------------------------------------------------------------ lifecycle
    def _start(self) -> None:
        if self._policy is None:
            self._policy = self._policy_factory()
        self._policy = self._policy.to(self._device).eval()
        if self._weight_sync is not None:
            self._weight_sync.attach(self)

    def _shutdown(self, timeout: float | None) -> None:
        if self._weight_sync is not None:
            self._weight_sync.detach(self)

    # ------------------------------------------------------------------ domain operations
    @property
    def policy_version(self) -> int:
        """How many weight updates this server has applied."""
        return self._version

    @torch.no_grad()
    def __call__(self, td: TensorDictBase) -> TensorDictBase:
        """Run the policy on ``td`` and return it with the outputs and ``policy_version`` written in."""
        self._require_running()
        source_device = td.device
        with self._lock:
            out = self._policy(td.to(self._device) if td.device != self._device else td)
            version = self._version
        out.set("policy_version", torch.full(out.batch_size, version, dtype=torch.long, device=out.device))
        target = self.device_config.output_device or source_device
        if target is not None and out.device != torch.device(target):
            out = out.to(target)
        return out

    def submit(self, td: TensorDictBase) -> Future:
        """Submit ``td``; the returned future holds the answer (already complete for ``direct``)."""
        future: Future = Future()
        try:
            future.set_result(self(td))
        except BaseException as exc:  # the future carries the failure to whoever waits on it
            future.set_exception(exc)
        return future

    def update_weights(self, weights: nn.Module | Mapping[str, torch.Tensor], version: int | None = None) -> int:
        """Copy ``weights`` (a module or a state dict) into the policy in place, between batches.

        Returns:
            The new ``policy_version``.
        """
        self._require_running()
        return self._apply_weights(weights.state_dict() if isinstance(weights, nn.Module) else weights, version)

    def _apply_weights(self, state: Mapping[str, torch.Tensor], version: int | None) -> int:
        with self._lock, torch.no_grad():
            own = self._policy.state_dict()
            missing = set(own) - set(state)
            if missing:
                raise ValueError(f"weight update lacks parameters {sorted(missing)!r}")
            for name, tensor in own.items():
                tensor.copy_(state[name])
            self._version = self._version + 1 if version is None else int(version)
        return self._version

    # weight-sync receiver protocol
    def load_weights(self, state: Mapping[str, torch.Tensor], version: int) -> None:
        """Apply a pushed version (called by weight sync, also while the server is starting)."""
        self._apply_weights(state, version)
