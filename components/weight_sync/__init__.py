"""Weight sync: versioned weights from the learner to inference owners and collectors.

Its place in the compatibility table is :mod:`components.weight_sync.declaration` (imported without torch).
"""

from __future__ import annotations

_EXPORTS = {"WeightSync": "sync", "LocalWeights": "channels", "RayWeights": "channels", "SharedWeights": "channels"}


def __getattr__(name: str):
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = sorted(_EXPORTS)
