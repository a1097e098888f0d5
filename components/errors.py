"""The public home of the project's error hierarchy (defined in `transports.kernel.errors`)."""

from transports.kernel.errors import (
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

__all__ = [
    "ConfigurationError",
    "IncompatibleCombinationError",
    "LayoutError",
    "NotImplementedYetError",
    "PeerFailureError",
    "RemoteError",
    "ServiceError",
    "ServiceTimeoutError",
    "SharedMemoryFull",
    "TransportError",
]
