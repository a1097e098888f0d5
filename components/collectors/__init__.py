"""Collectors: environments stepped against a policy, in the caller, on threads, in processes or in Ray actors.

Their place in the compatibility table is :mod:`components.collectors.declaration` (imported without torch).
"""

from __future__ import annotations

_EXPORTS = {
    "Collector": "collector",
    "CollectorClient": "collector",
    "SEED_STRIDE": "collector",
    "AsyncBatchedCollector": "async_collector",
    "Worker": "worker",
}


def __getattr__(name: str):
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = sorted(_EXPORTS)
