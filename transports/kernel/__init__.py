"""The kernel under every package of the project: the error hierarchy (`transports.kernel.errors`), typed options with
declared ranges and their checks (`transports.kernel.options`), and the placement vocabulary with its registry
(`transports.kernel.placements`).

``transports`` and ``components`` both build on it; it imports nothing else of the project, and nothing heavy.
"""

from .errors import (
    ConfigurationError,
    IncompatibleCombinationError,
    LayoutError,
    NotImplementedYetError,
    PeerFailureError,
    RemoteError,
    ServiceError,
    ServiceTimeoutError,
    SharedMemoryFull,
    TransportError,
)
from .placements import Placement, Reach, normalize_placement, placement_names

__all__ = [
    "ConfigurationError",
    "IncompatibleCombinationError",
    "LayoutError",
    "NotImplementedYetError",
    "PeerFailureError",
    "Placement",
    "Reach",
    "RemoteError",
    "ServiceError",
    "ServiceTimeoutError",
    "SharedMemoryFull",
    "TransportError",
    "normalize_placement",
    "placement_names",
]
