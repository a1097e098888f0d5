"""What runs where the inference server is placed: the policy, its device and weights, and (behind a
transport) the serving loop.

``ServedPolicy`` is built by the host of the server's placement from a picklable factory of the policy. Behind
a transport it serves batches with `ServingCore` (weight updates applied
between batches); in the caller's thread (``direct``) it is called directly, one forward per call.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Mapping

import torch
from tensordict import TensorDictBase

from .config import InferenceServerConfig
from .core import ServingCore, copy_weights, default_collate
from .static import StaticBatches, cuda_graph

UPDATE_TIMEOUT = 60.0


def keep(policy: torch.nn.Module) -> torch.nn.Module:
    """A factory for a policy object built already (hosts in the owner's process only)."""
    return policy


class ServedPolicy:
    """The policy where it lives.

    Args:
        build: picklable callable returning the policy (a TensorDict module).
        server_side: the serving side of the endpoint's transport, or ``None`` (called in the caller's thread).
        config: batching settings and devices.
        weight_sync: a weight-sync client polled between batches (or before each direct call).
        collate_fn: combines requests into a batch.
        request_layout: the layout of one request (what a static batch's graph is captured for).
        capture: builds the graph of static batches (``None``: a CUDA graph).
    """

    def __init__(self, build: Callable[[], torch.nn.Module], server_side: Any, config: InferenceServerConfig,
                 weight_sync: Any = None, collate_fn: Callable | None = None, request_layout: Any = None,
                 capture: Callable | None = None):
        config.check_devices()  # here, where the policy runs: the plan may have been made on another node
        self.device = torch.device(config.policy_device)
        self.output_device = config.output_device
        self._output = None if config.output_device is None else torch.device(config.output_device)
        self.policy = build().to(self.device).eval()
        self.weight_sync = weight_sync
        self._version = 0
        self._lock = threading.Lock()
        static = None
        if config.static_batch_size is not None and server_side is not None:
            static = StaticBatches(self.policy, request_layout, config.static_batch_size, self.device,
                                   config.interaction_mode, capture or cuda_graph)
        self.core = None if server_side is None else ServingCore(
            self.policy, server_side.server(), config, weight_sync, collate_fn, static)
        if static is not None:  # captured here, as the server starts, with the first weights the sync has
            self.core.apply_updates()
            static.capture()

    def serve(self, stop: threading.Event) -> None:
        """Run the serving loop until ``stop`` is set (the host calls it on a thread of its own)."""
        self.core.run(stop)

    # ------------------------------------------------------------------ control calls
    def version(self) -> int:
        """The version of the weights the policy holds (0 before any update)."""
        return self._version if self.core is None else self.core.version

    def update_weights(self, state: Mapping[str, torch.Tensor], version: int | None) -> int:
        """Copy ``state`` into the policy; with a serving loop the copy happens between batches.

        Args:
            state: the new parameters, by name.
            version: the version to stamp, or ``None`` for one more than the current.

        Returns:
            The version now served.
        """
        if self.core is not None:
            return self.core.request_update(state, version).result(UPDATE_TIMEOUT)
        with self._lock:
            copy_weights(self.policy, state)
            self._version = self._version + 1 if version is None else int(version)
            return self._version

    def stats(self) -> dict:
        """The serving loop's statistics (`snapshot`); zeros without a loop."""
        if self.core is None:
            return {"batches": 0, "requests": 0, "mean_batch_size": 0.0, "batch_size_histogram": {}}
        return self.core.stats.snapshot()

    @torch.no_grad()
    def probe(self, td: TensorDictBase) -> TensorDictBase:
        """The answer a request like ``td`` gets, from a forward on a clone (collated, on the policy device, stamped,
        on the output device) without serving it: its layout binds a discovering endpoint. A policy whose forward
        changes state should be given explicit layouts instead."""
        collate = self.core.collate if self.core is not None else default_collate
        batch = collate([td.clone()])
        out = self.policy(batch.to(self.device) if batch.device != self.device else batch)
        out = out.exclude(*batch.keys(True, True))
        out.set("policy_version", torch.full(out.batch_size, self.version(), dtype=torch.long, device=out.device))
        target = torch.device(self.output_device or "cpu")
        return (out.to(target) if out.device != target else out)[0]

    # ------------------------------------------------------------------ in the caller's thread
    @torch.no_grad()
    def forward(self, td: TensorDictBase) -> TensorDictBase:
        """One forward on ``td`` with ``policy_version`` stamped, outputs on the output (or request's) device."""
        with self._lock:
            if self.weight_sync is not None:
                update = self.weight_sync.poll(self._version, into=self.policy)
                if update is not None:
                    self._version = update
            source_device = td.device
            out = self.policy(td.to(self.device) if td.device != self.device else td)
            version = self._version
        out.set("policy_version", torch.full(out.batch_size, version, dtype=torch.long, device=out.device))
        target = self._output or source_device
        if target is not None and out.device != target:
            out = out.to(target)
        return out
