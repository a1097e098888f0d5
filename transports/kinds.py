"""The two vocabularies: placements (where an owner lives) and transport kinds (how payloads move).

Transport kinds, their aliases and how far their clients reach are the registered transports' own
(:mod:`transports.registry`, each from its :class:`~transports.descriptor.TransportDescriptor`); this module names
them in canonical spellings, so every other module compares those.
"""

from __future__ import annotations

from . import registry
from .descriptor import Reach
from .errors import ConfigurationError

PLACEMENTS: tuple[str, ...] = ("direct", "thread", "process", "ray", "distributed", "submitit", "rpc", "monarch")
"""Where an owner is constructed and runs. ``submitit`` and ``rpc`` apply to collectors only."""

PLACEMENT_ALIASES: dict[str, str] = {"threading": "thread", "multiprocessing": "process"}

DISTANCE: dict[str, Reach] = {
    "direct": Reach.PROCESS,
    "thread": Reach.PROCESS,
    "process": Reach.MACHINE,
    "ray": Reach.NETWORK,
    "distributed": Reach.NETWORK,
    "submitit": Reach.NETWORK,
    "rpc": Reach.NETWORK,  # rpc workers reach services as workers of any rpc world would: over network transports
    "monarch": Reach.NETWORK,
}
"""How far from the driver each placement puts an owner: what a client it is handed must reach."""


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
    return registry.describe(transport).reach >= DISTANCE[placement]


def _normalize(value: object, vocabulary: tuple[str, ...], aliases: dict[str, str], what: str, path: str | None):
    if not isinstance(value, str):
        raise ConfigurationError(f"{what} must be a string, got {value!r}", path=path, alternatives=vocabulary)
    name = value.strip().lower().replace("-", "_")
    name = aliases.get(name, name)
    if name not in vocabulary:
        raise ConfigurationError(f"unknown {what} {value!r}", path=path, alternatives=vocabulary)
    return name


def normalize_placement(value: object, *, path: str | None = None) -> str:
    """Return the canonical placement name for ``value`` (aliases accepted).

    Raises:
        ConfigurationError: ``value`` is not a placement.
    """
    return _normalize(value, PLACEMENTS, PLACEMENT_ALIASES, "placement", path)


def normalize_transport_kind(value: object, *, path: str | None = None) -> str:
    """Return the canonical transport kind for ``value`` (aliases accepted; ``None`` means ``auto``).

    Raises:
        ConfigurationError: ``value`` is not a registered transport kind.
    """
    if value is None:
        return "auto"
    return _normalize(value, transport_kinds(), transport_aliases(), "transport", path)
