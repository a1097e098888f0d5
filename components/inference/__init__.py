"""The inference service: an auto-batching policy server and its clients.

Its place in the compatibility table is `components.inference.declaration` (imported without torch);
the server, its clients and configs load on first use.
"""

from __future__ import annotations

from ..exports import lazy_exports

_EXPORTS = {
    "InferenceClient": "client",
    "PolicyClientModule": "client",
    "InferenceServerConfig": "config",
    "InferenceServer": "server",
    "PolicyReplica": "replica",
}

__getattr__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
