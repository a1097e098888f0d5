"""The vocabulary of transport kinds (how payloads move), and whether a kind reaches a placement.

Transport kinds, their aliases and how far their clients reach are the registered transports' own
(`transports.registry`, each from its `TransportDescriptor`); this module names
them in canonical spellings, so every other module compares those.
"""

from __future__ import annotations

from . import registry
from .kernel.errors import ConfigurationError
from .kernel.placements import normalize_name, reach_of


def transport_kinds() -> tuple[str, ...]:
    """``auto`` and every registered transport kind, in table order."""
    return ("auto", *(d.kind for d in registry.descriptors()))


def transport_aliases() -> dict[str, str]:
    """Other spellings of the registered kinds -> the kind."""
    return {alias: d.kind for d in registry.descriptors() for alias in d.aliases}


def transport_label(kind: str, options: dict | None = None) -> str:
    """``kind`` as the plan prints it: with the wire it rides where there is a choice (``distributed (gloo)``)."""
    try:
        return registry.describe(kind).label(options)
    except ConfigurationError:  # '-' (takes none), or a transport given as an instance of an unregistered class
        return kind


def reaches(transport: str, placement: str) -> bool:
    """Whether a client over ``transport`` still works when its user is placed at ``placement``."""
    return registry.describe(transport).reach >= reach_of(placement)


def normalize_transport_kind(value: object, *, path: str | None = None) -> str:
    """Return the canonical transport kind for ``value`` (aliases accepted; ``None`` means ``auto``).

    Raises:
        ConfigurationError: ``value`` is not a registered transport kind.
    """
    if value is None:
        return "auto"
    return normalize_name(value, transport_kinds(), transport_aliases(), "transport", path)
