"""The replay buffer service: storage, samplers and policy-age filtering behind ``extend`` / ``sample``.

Its place in the compatibility table is `components.replay.declaration` (imported without torch); the
rest loads on first use.
"""

from __future__ import annotations

from ..exports import lazy_exports
from .config import SAMPLERS

_EXPORTS = {
    "ReplayBuffer": "buffer",
    "ReplayConfig": "config",
    "ReplayClient": "client",
    "ReplayStorage": "storage",
    "PolicyAgeFilter": "filters",
}

__getattr__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted([*_EXPORTS, "SAMPLERS"])
