"""Collectors: environments stepped against a policy, in the caller, on threads, in processes or in Ray actors.

Their place in the compatibility table is `components.collectors.declaration` (imported without torch).
"""

from __future__ import annotations

from ..exports import lazy_exports

_EXPORTS = {
    "Collector": "collector",
    "CollectorClient": "collector",
    "SEED_STRIDE": "collector",
    "AsyncBatchedCollector": "async_collector",
    "CollectorConfig": "config",
    "Worker": "worker",
}

__getattr__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
