"""Inference server configuration: execution and batching, and device placement. Both check their values on
construction, so the plan (which builds them from YAML) and a user building a server from Python get the same
errors, naming ``components.inference.<field>``, the value and the allowed range."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..declaration import require


@dataclass
class InferenceServerConfig:
    """Server-side execution, batching and instrumentation.

    Attributes:
        placement: where the server runs (``direct``, ``thread``, ``process``...); ``None`` takes the
            ``service_backend`` context, else ``direct``.
        max_batch_size: most requests combined into one forward pass.
        min_batch_size: fewest requests to wait for (up to ``timeout``) before a forward pass.
        timeout: seconds to wait for ``min_batch_size`` requests before serving what is there.
        collect_stats: keep batch-size, queue-wait and forward-time statistics.
        stats_window: number of recent batches the statistics cover.
    """

    placement: Optional[str] = None
    max_batch_size: int = 64
    min_batch_size: int = 1
    timeout: float = 0.002
    collect_stats: bool = True
    stats_window: int = 1000

    def __post_init__(self):
        c = "inference"
        require(c, "max_batch_size", self.max_batch_size, self.max_batch_size >= 1, ">= 1")
        require(c, "min_batch_size", self.min_batch_size, 1 <= self.min_batch_size <= self.max_batch_size,
                f"in [1, max_batch_size={self.max_batch_size}]")
        require(c, "timeout", self.timeout, self.timeout >= 0, ">= 0 seconds")
        require(c, "stats_window", self.stats_window, self.stats_window >= 1, ">= 1")


@dataclass
class InferenceDeviceConfig:
    """Where the policy runs and where its outputs are delivered.

    Attributes:
        policy_device: device of the policy forward pass.
        output_device: device of the tensors handed back to callers (``None``: the request's device).
    """

    policy_device: str = "cpu"
    output_device: Optional[str] = None

    def __post_init__(self):
        for name in ("policy_device", "output_device"):
            value = getattr(self, name)
            if value is not None:
                require("inference", name, value, _usable_device(value), "a device this machine has (cpu, or cuda[:N] "
                                                                       "with CUDA available)")


def _usable_device(name: str) -> bool:
    import torch

    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        return False
    if device.type == "cuda":
        return torch.cuda.is_available() and (device.index is None or device.index < torch.cuda.device_count())
    return device.type in ("cpu", "meta") or hasattr(torch, device.type)
