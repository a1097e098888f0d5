"""The placement vocabulary: where an owner lives, and how far that is from the driver.

Each placement is declared by the module of its host (``components/hosts/<placement>.py``) with `register`,
next to its host class: its name, the other spellings accepted for it, how far from the driver it puts an owner
(`Reach`, which a client handed to that owner must reach), and what it says about itself. Nothing here knows
which placements exist; the order they are registered in is the order of every table that lists them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from .errors import ConfigurationError


class Reach(enum.IntEnum):
    """How far a client can travel from its owner and still work (ordered: each reaches what the ones before do)."""

    PROCESS = 0
    """Threads of the owner's process only."""
    MACHINE = 1
    """Any process of the owner's machine (shared memory, local sockets)."""
    NETWORK = 2
    """Any process that can reach the owner's address (another machine of a cluster)."""

    @property
    def words(self) -> str:
        """The reach in words, for plans and tables."""
        return {0: "same process", 1: "same machine", 2: "network"}[self.value]


@dataclass(frozen=True)
class Placement:
    """What one placement declares about itself.

    Attributes:
        name: the placement's name (``placement: <name>`` in YAML, ``service=<name>``).
        host: its host class (a `components.hosts.base.Host` subclass), which builds and serves owners there.
        reach: how far from the driver it puts an owner: a client that owner is handed must reach that far.
        aliases: other spellings accepted for ``name``.
        summary: one line for tables and the documentation (which components it takes, where it runs).
    """

    name: str
    host: Any
    reach: Reach
    aliases: tuple[str, ...] = ()
    summary: str = ""


_REGISTERED: dict[str, Placement] = {}


def register(placement: Placement) -> Placement:
    """Add a placement: its name (and aliases) become a placement everywhere (YAML, scopes, plans, the tables).
    Registering the same name again replaces its declaration (a module imported twice). Returns ``placement``.

    Raises:
        ValueError: the name or an alias is taken by another placement.
    """
    taken = {n: p.name for p in _REGISTERED.values() for n in (p.name, *p.aliases) if p.name != placement.name}
    for name in (placement.name, *placement.aliases):
        if name in taken:
            raise ValueError(f"placement name {name!r} is taken (by {taken[name]!r})")
    _REGISTERED[placement.name] = placement
    return placement


def unregister(name: str) -> None:
    """Remove the placement ``name`` (nothing happens when none is registered)."""
    _REGISTERED.pop(name, None)


def placements() -> tuple[Placement, ...]:
    """Every registered placement, in the order registered."""
    return tuple(_REGISTERED.values())


def placement_names() -> tuple[str, ...]:
    """Every registered placement's name, in the order registered."""
    return tuple(_REGISTERED)


def describe_placement(name: str) -> Placement:
    """The declaration of placement ``name`` (canonical spelling).

    Raises:
        ConfigurationError: no placement of that name is registered.
    """
    try:
        return _REGISTERED[name]
    except KeyError:
        raise ConfigurationError(f"unknown placement {name!r}", path="placement",
                                 alternatives=placement_names()) from None


def reach_of(name: str) -> Reach:
    """How far from the driver placement ``name`` puts an owner (an unregistered name counts as the furthest)."""
    found = _REGISTERED.get(name)
    return found.reach if found is not None else Reach.NETWORK


def normalize_name(value: object, vocabulary: tuple[str, ...], aliases: dict[str, str], what: str,
                   path: str | None) -> str:
    """``value`` in its canonical spelling: case and ``-``/``_`` do not matter, aliases are accepted.

    Raises:
        ConfigurationError: ``value`` is not a string, or names nothing in ``vocabulary``.
    """
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
        ConfigurationError: ``value`` is not a registered placement.
    """
    aliases = {alias: p.name for p in _REGISTERED.values() for alias in p.aliases}
    return normalize_name(value, placement_names(), aliases, "placement", path)
