"""Inference server configuration: execution and batching, and device placement."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


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
        if self.max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {self.max_batch_size!r}")
        if not 1 <= self.min_batch_size <= self.max_batch_size:
            raise ValueError(
                f"min_batch_size must be in [1, max_batch_size={self.max_batch_size}], got {self.min_batch_size!r}"
            )
        if self.timeout < 0:
            raise ValueError(f"timeout must be >= 0, got {self.timeout!r}")


@dataclass
class InferenceDeviceConfig:
    """Where the policy runs and where its outputs are delivered.

    Attributes:
        policy_device: device of the policy forward pass.
        output_device: device of the tensors handed back to callers (``None``: the request's device).
    """

    policy_device: str = "cpu"
    output_device: Optional[str] = None
