"""The replay buffer service: storage, samplers and policy-age filtering behind ``extend`` / ``sample``.

Its place in the compatibility table is :mod:`components.replay.declaration` (imported without torch); the
rest loads on first use.
"""

from __future__ import annotations

from .declaration import SAMPLERS

_EXPORTS = {
    "ReplayBuffer": "buffer",
    "ReplayClient": "client",
    "ReplayStorage": "storage",
    "PolicyAgeFilter": "filters",
}


def __getattr__(name: str):
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = sorted([*_EXPORTS, "SAMPLERS"])
