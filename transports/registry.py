"""Transports by kind: every registered `TransportDescriptor`, and building both ends of
a request/reply transport from its kind and options.

The built-in descriptors (`transports.descriptor.BUILT_IN`) are registered from the start; `register`
adds another (a transport of your own, in a module of yours). Components never import a transport module: they ask
`build` for a kind the compatibility table resolved, and the plan checks the options (`check_options`)
and layouts (`check_layouts`) from the descriptor alone, before any transport module is imported.
"""

from __future__ import annotations

import importlib
from typing import Any, Mapping

from .descriptor import BUILT_IN, TransportDescriptor
from .kernel.errors import ConfigurationError

_REGISTERED: dict[str, TransportDescriptor] = {d.kind: d for d in BUILT_IN}


def register(descriptor: TransportDescriptor) -> TransportDescriptor:
    """Add a transport: its kind (and aliases) become a transport name everywhere (YAML, plans, the table's
    cells that list it). Returns ``descriptor``.

    Raises:
        ValueError: the kind or an alias is taken by another transport.
    """
    taken = {name: d.kind for d in _REGISTERED.values() for name in (d.kind, *d.aliases) if d.kind != descriptor.kind}
    for name in (descriptor.kind, *descriptor.aliases):
        if name in taken or name == "auto":
            raise ValueError(f"transport name {name!r} is taken (by {taken.get(name, 'auto')!r})")
    _REGISTERED[descriptor.kind] = descriptor
    return descriptor


def unregister(kind: str) -> None:
    """Remove a transport `register` added (built-in ones stay)."""
    if any(d.kind == kind for d in BUILT_IN):
        raise ValueError(f"{kind!r} is a built-in transport")
    _REGISTERED.pop(kind, None)


def descriptors() -> tuple[TransportDescriptor, ...]:
    """Every registered descriptor, built-in ones first, in their table order."""
    return tuple(_REGISTERED.values())


def describe(kind: str) -> TransportDescriptor:
    """The descriptor of ``kind``.

    Raises:
        ConfigurationError: no transport of that kind is registered.
    """
    try:
        return _REGISTERED[kind]
    except KeyError:
        raise ConfigurationError(f"no transport {kind!r} is registered", path="transport",
                                 alternatives=tuple(_REGISTERED)) from None


def find(kind: str) -> TransportDescriptor | None:
    """The descriptor of ``kind``, or ``None`` when none is registered (``-``: a component that takes none)."""
    return _REGISTERED.get(kind)


def transport_class(kind: str) -> type:
    """The transport class of ``kind`` (its module is imported here, on first use)."""
    module, name = describe(kind).implementation.split(":")
    return getattr(importlib.import_module(module), name)


def check_options(kind: str, options: Mapping[str, Any], *, path: str = "transport_options") -> None:
    """Check ``options`` against the descriptor of ``kind``: known names and declared ranges (no import); then, where
    the transport class checks more than a range (``distributed``: ``nccl`` needs CUDA here), its own
    ``check_options(options, path=...)``.

    Raises:
        ConfigurationError: an option the transport does not take (naming the ones it does) or a value outside
            what it allows.
    """
    if not options:
        return
    descriptor = describe(kind)
    descriptor.check(options, path=path)
    if descriptor.checks_more:
        transport_class(kind).check_options(options, path=path)


def check_layouts(kind: str, layouts_known: bool, *, path: str = "transport") -> None:
    """Raise when ``kind`` needs fixed layouts and none are known (never fall back to another kind silently)."""
    if describe(kind).fixed_layout and not layouts_known:
        raise ConfigurationError(
            f"transport {kind!r} needs request and response layouts (fixed layouts) before the server starts; pass "
            "both, or use transport 'queue' for payloads whose layout is not known up front",
            path=path, alternatives=("queue",),
        )


def build(kind: str, options: Mapping[str, Any] | None = None, *, request_layout: Any = None,
          response_layout: Any = None, name: str = "service", **extra: Any) -> Any:
    """Build the request/reply transport of ``kind`` on the owner's side.

    Args:
        kind: a registered kind.
        options: its keyword options (``transport_options``), checked with the resolution.
        request_layout: one request's layout (fixed-layout kinds).
        response_layout: one response's layout (fixed-layout kinds).
        name: names the endpoint in messages.
        extra: keyword arguments a component hands its transport beside the options (replay's ``operations``).
    """
    descriptor = describe(kind)
    cls = transport_class(kind)
    if getattr(cls, "descriptor", None) is not descriptor:
        raise TypeError(f"{descriptor.implementation} does not carry the descriptor registered for {kind!r}")
    layouts = {"request_layout": request_layout, "response_layout": response_layout} if descriptor.fixed_layout else {}
    return cls(**layouts, **dict(options or {}), name=name, **extra)
