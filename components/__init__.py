"""Services: the owner/client contract (`components.service`), one resolution per component (`components.resolution`),
scoped defaults, errors, the compatibility table assembled from each service's declaration (`components.compat`),
one host per placement (`components.hosts`), acknowledged commands (`components.commands`), and one package per service:
``inference``, ``replay``, ``logger``, ``collectors``, ``weight_sync``."""

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

# last: a plugin registers its placements, transports and env families with the modules above
from transports.kernel.plugins import load_plugins  # noqa: E402

load_plugins()

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
