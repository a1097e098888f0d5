"""Services: the owner/client contract, scoped defaults, errors, the compatibility table, and one module
or package per domain (inference, replay, logger, collector, weight sync)."""

from .errors import (
    ConfigurationError,
    IncompatibleCombinationError,
    LayoutError,
    NotImplementedYetError,
    PeerFailureError,
    RemoteError,
    ServiceError,
    ServiceTimeoutError,
    TransportError,
)
from .scope import service_backend, transport_backend
from .service import Owner, Service

__all__ = [
    "ConfigurationError",
    "IncompatibleCombinationError",
    "LayoutError",
    "NotImplementedYetError",
    "Owner",
    "PeerFailureError",
    "RemoteError",
    "Service",
    "ServiceError",
    "ServiceTimeoutError",
    "TransportError",
    "service_backend",
    "transport_backend",
]
