"""The inference service: an auto-batching policy server and its clients.

Its place in the compatibility table is :mod:`components.inference.declaration` (imported without torch);
the server, its clients and configs load on first use.
"""

from __future__ import annotations

_EXPORTS = {
    "InferenceClient": "client",
    "PolicyClientModule": "client",
    "InferenceDeviceConfig": "config",
    "InferenceServerConfig": "config",
    "InferenceServer": "server",
}


def __getattr__(name: str):
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = sorted(_EXPORTS)
