"""Transports by kind: one registry builds both ends of any request/reply transport from its kind and options.

A new transport is one new module plus one line in :data:`TRANSPORTS`. Components never import a transport
module directly; they ask :func:`build` for a kind the compatibility table resolved, and the plan checks the
options (:func:`check_options`) before anything starts.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any, Mapping

from .errors import ConfigurationError

TRANSPORTS: dict[str, str] = {
    "thread": "transports.thread:ThreadTransport",
    "direct": "transports.direct:DirectSlotTransport",
    "queue": "transports.queue:QueueTransport",
    "shared_memory": "transports.shared_memory:SharedMemoryTransport",
    "process_slot": "transports.process_slot:ProcessSlotTransport",
    "ray": "transports.ray:RayTransport",
    "monarch": "transports.monarch:MonarchTransport",
    "distributed": "transports.distributed:DistributedTransport",
}
"""kind -> ``module:class`` of its request/reply transport (imported on first use)."""

FIXED_LAYOUT: frozenset = frozenset({"shared_memory", "process_slot", "distributed"})
"""Kinds that preallocate from request and response layouts known before the server starts."""

_BUILT_IN = frozenset({"request_layout", "response_layout", "name", "context", "self"})


def transport_class(kind: str) -> type:
    """The transport class of ``kind``.

    Raises:
        ConfigurationError: no request/reply transport of that kind is built.
    """
    try:
        module, name = TRANSPORTS[kind].split(":")
    except KeyError:
        raise ConfigurationError(f"no request/reply transport {kind!r} is built", path="transport",
                                 alternatives=tuple(TRANSPORTS)) from None
    return getattr(importlib.import_module(module), name)


def check_options(kind: str, options: Mapping[str, Any], *, path: str = "transport_options") -> None:
    """Check that ``options`` are keyword arguments the transport of ``kind`` takes, and their values where the
    transport class says how (its ``check_options(options, path=...)``). Imports only that transport's module.

    Raises:
        ConfigurationError: an option the transport does not take, naming it and the ones it does.
    """
    if not options or kind not in TRANSPORTS:
        return
    cls = transport_class(kind)
    accepted = [p for p in inspect.signature(cls.__init__).parameters if p not in _BUILT_IN]
    for key in options:
        if key not in accepted:
            raise ConfigurationError(f"transport {kind!r} takes no option {key!r}", path=f"{path}.{key}",
                                     alternatives=tuple(accepted))
    check = getattr(cls, "check_options", None)
    if check is not None:
        check(options, path=path)


def check_layouts(kind: str, layouts_known: bool, *, path: str = "transport") -> None:
    """Raise when ``kind`` needs fixed layouts and none are known (never fall back to another kind silently)."""
    if kind in FIXED_LAYOUT and not layouts_known:
        raise ConfigurationError(
            f"transport {kind!r} needs request and response layouts (fixed layouts) before the server starts; pass "
            "both, or use transport 'queue' for payloads whose layout is not known up front",
            path=path, alternatives=("queue",),
        )


def build(kind: str, options: Mapping[str, Any] | None = None, *, request_layout: Any = None,
          response_layout: Any = None, name: str = "service") -> Any:
    """Build the request/reply transport of ``kind`` on the owner's side.

    Args:
        kind: a resolved transport kind.
        options: the transport's keyword options (``transport_options``).
        request_layout: one request's layout (fixed-layout kinds).
        response_layout: one response's layout (fixed-layout kinds).
        name: names the endpoint in messages.
    """
    options = dict(options or {})  # checked with the resolution (check_options, check_layouts)
    cls = transport_class(kind)
    if "name" in inspect.signature(cls.__init__).parameters:
        options["name"] = name
    if kind in FIXED_LAYOUT:
        return cls(request_layout, response_layout, **options)
    return cls(**options)
