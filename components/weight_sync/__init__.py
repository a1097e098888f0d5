"""Weight sync: versioned weights from the learner to inference owners and collectors.

Its place in the compatibility table is `components.weight_sync.declaration` (imported without torch).
"""

from __future__ import annotations

from ..exports import lazy_exports

_EXPORTS = {"WeightSync": "sync", "WeightSyncConfig": "config", "LocalWeights": "channels", "RayWeights": "channels",
            "SharedWeights": "channels", "DistributedWeights": "hub"}

__getattr__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
