"""``PolicyAgeFilter``: keep the replay buffer within a bounded policy lag.

The inference server stamps every answer with ``policy_version``; the filter compares those stamps with the
live version (a weight-sync client's ``version``, or any callable returning it) and drops transitions whose
lag exceeds ``max_policy_lag``: at ``extend`` time (never stored) or at ``sample`` time (evicted before
sampling, so a batch holds only fresh enough transitions). Versions only grow, so a stale transition stays
stale until overwritten.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

WHEN = ("extend", "sample")


@dataclass(frozen=True)
class PolicyAgeFilter:
    """Drop transitions older than ``max_policy_lag`` versions.

    Args:
        max_policy_lag: the largest allowed ``live_version - policy_version``.
        source: where the live version comes from: an object with ``version`` (a weight-sync owner or client)
            or a callable returning it. It must be usable where the buffer lives.
        when: ``"extend"`` or ``"sample"``.
        key: the stamped version's key.
    """

    max_policy_lag: int
    source: Any
    when: str = "extend"
    key: str = "policy_version"

    def __post_init__(self):
        if self.when not in WHEN:
            raise ValueError(f"PolicyAgeFilter.when must be one of {WHEN}, got {self.when!r}")
        if self.max_policy_lag < 0:
            raise ValueError(f"max_policy_lag must be >= 0, got {self.max_policy_lag!r}")

    def live_version(self) -> int:
        """The current policy version, read from `source` (its ``version``, or a call)."""
        source = self.source
        return int(source.version if hasattr(source, "version") else source())

    def fresh(self, versions: torch.Tensor) -> torch.Tensor:
        """A boolean mask: which stamped versions are within the allowed lag of the live version."""
        versions = versions.reshape(versions.shape[0], -1)[:, 0] if versions.dim() > 1 else versions
        return versions >= self.live_version() - self.max_policy_lag
