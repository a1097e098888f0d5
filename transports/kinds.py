"""The two vocabularies: placements (where an owner lives) and transport kinds (how payloads move).

Names are normalized once, here, so every other module compares canonical spellings.
"""

from __future__ import annotations

from .errors import ConfigurationError

PLACEMENTS: tuple[str, ...] = ("direct", "thread", "process", "ray", "distributed", "submitit", "rpc", "monarch")
"""Where an owner is constructed and runs. ``submitit`` and ``rpc`` apply to collectors only."""

TRANSPORT_KINDS: tuple[str, ...] = (
    "auto",
    "direct",
    "thread",
    "queue",
    "shared_memory",
    "process_slot",
    "ray",
    "distributed",
    "monarch",
)
"""How payloads move between clients and an owner. ``auto`` asks the component to choose."""

PLACEMENT_ALIASES: dict[str, str] = {"threading": "thread", "multiprocessing": "process"}
TRANSPORT_ALIASES: dict[str, str] = {
    "threading": "thread",
    "multiprocessing": "queue",
    "process": "queue",
    "shm": "shared_memory",
}

# How far a client of each transport can travel from its owner; the launcher uses it to check that a
# dependant placed elsewhere can still reach its dependency.
REACH: dict[str, str] = {
    "direct": "process",
    "thread": "process",
    "queue": "host",
    "shared_memory": "host",
    "process_slot": "host",
    "ray": "cluster",
    "distributed": "cluster",
    "monarch": "cluster",  # Monarch actors may live on other hosts of a mesh
}
# How far from the driver each placement puts an owner.
DISTANCE: dict[str, str] = {
    "direct": "process",
    "thread": "process",
    "process": "host",
    "ray": "cluster",
    "distributed": "cluster",
    "submitit": "cluster",
    "rpc": "cluster",  # rpc workers reach services as workers of any rpc world would: over cluster transports
    "monarch": "cluster",
}
_ORDER = {"process": 0, "host": 1, "cluster": 2}
# Kinds whose payloads ride a wire chosen by an option: that option and its default (the transport's own).
WIRES: dict[str, tuple[str, str]] = {"distributed": ("backend", "gloo")}


def transport_label(kind: str, options: dict | None = None) -> str:
    """``kind`` as the plan prints it: with the wire it rides where there is a choice (``distributed (gloo)``)."""
    wire = WIRES.get(kind)
    return kind if wire is None else f"{kind} ({(options or {}).get(wire[0], wire[1])})"


def reaches(transport: str, placement: str) -> bool:
    """Whether a client over ``transport`` still works when its user is placed at ``placement``."""
    return _ORDER[REACH[transport]] >= _ORDER[DISTANCE[placement]]


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
        ConfigurationError: ``value`` is not a transport kind.
    """
    if value is None:
        return "auto"
    return _normalize(value, TRANSPORT_KINDS, TRANSPORT_ALIASES, "transport", path)
