"""Inference in a Ray actor: the batching server runs inside the actor; requests travel as Ray calls.

The actor builds the policy from ``policy_factory`` and serves it with the same :class:`ServingCore` as the
other placements, on a thread of the actor. Each ``infer`` call is one request: the actor runs up to
``max_concurrency`` calls at once (at least ``max_batch_size``), so concurrent callers are batched into one
forward pass exactly as on a thread server.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from tensordict import TensorDictBase

from ..ray_support import RayFuture, remote


class InferenceActor:
    """The body of the inference actor."""

    def __init__(self, policy_factory, config, device_config, weight_sync, collate_fn):
        import torch

        from .server import InferenceServer

        torch.set_num_threads(1)
        self.server = InferenceServer(
            policy_factory=policy_factory, config=dataclasses.replace(config, placement="thread"),
            device_config=device_config, transport="thread", weight_sync=weight_sync, collate_fn=collate_fn,
        ).start()
        self.endpoint = self.server._transport.client()

    def ready(self) -> int:
        import os

        return os.getpid()

    def infer(self, td: TensorDictBase) -> TensorDictBase:
        return self.endpoint.submit(td).result()

    def update_weights(self, state, version):
        return self.server.update_weights(state, version)

    def version(self) -> int:
        return self.server.policy_version

    def stats(self) -> dict:
        return self.server.stats()

    def stop(self) -> None:
        self.server.shutdown()


class RayInferenceEndpoint:
    """The client endpoint of a Ray inference owner: ``submit(td)`` is one actor call. Picklable anywhere in
    the cluster (it holds the actor handle)."""

    def __init__(self, handle: Any):
        self.handle = handle

    def submit(self, td: TensorDictBase) -> RayFuture:
        return remote(self.handle, "infer", (td,), "inference request")
