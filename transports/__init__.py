"""Payload transports: how TensorDicts and commands move between clients and owners.

This package knows no domain (no inference, replay or logging): it holds the kernel every package builds on
(`transports.kernel`: errors, option checks, the placement vocabulary), what each transport says about itself
(`transports.descriptor`), the vocabulary of kinds derived from it, the ``TransportConfig`` value and the data
of a transport choice, wire ``Layout`` s, shared-memory segments, the registry that builds a transport by kind
(`transports.registry`), and one module or package per transport over `transports.base.Transport`.
"""

from . import _startup

_startup.install()  # first: importing tensordict in this process then skips torch's compiler frontend (see _startup)

from .config import TransportConfig, as_transport_config  # noqa: E402
from .descriptor import TransportDescriptor  # noqa: E402
from .kernel.errors import (  # noqa: E402
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
from .kernel.placements import Reach, normalize_placement  # noqa: E402
from .kinds import normalize_transport_kind, transport_kinds  # noqa: E402
from .registry import register  # noqa: E402
from .resolver import Resolution, TransportContext  # noqa: E402


def __getattr__(name: str):
    if name == "PLACEMENTS":  # the placements registered now (their host modules register them)
        from .kernel.placements import placement_names

        return placement_names()
    # Layouts and transport classes need torch and tensordict; import them on first use so that
    # configuration checks (and their error messages) stay fast.
    if name in ("Layout", "LeafSpec"):
        from . import layout

        return getattr(layout, name)
    if name in ("Transport", "RequestReplyTransport"):
        from . import base

        return getattr(base, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ConfigurationError",
    "IncompatibleCombinationError",
    "Layout",
    "LayoutError",
    "LeafSpec",
    "NotImplementedYetError",
    "PLACEMENTS",
    "PeerFailureError",
    "Reach",
    "RemoteError",
    "RequestReplyTransport",
    "Resolution",
    "ServiceError",
    "ServiceTimeoutError",
    "Transport",
    "TransportConfig",
    "TransportContext",
    "TransportDescriptor",
    "TransportError",
    "as_transport_config",
    "normalize_placement",
    "normalize_transport_kind",
    "register",
    "transport_kinds",
]
