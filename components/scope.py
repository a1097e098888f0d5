"""Scoped defaults for placement and transport: ``service_backend`` and ``transport_backend``.

Both are context managers over `contextvars`, so a default is local to the thread or asyncio task
that set it, nests, and is restored on exit (also when the block raises). A value set in a parent process
is ignored in forked children (each value remembers the process that set it) and never reaches spawned
ones. Precedence everywhere: explicit argument > scoped default > component default.

Examples:
    >>> with service_backend("direct"), transport_backend("auto"):
    ...     buffer = ReplayBuffer(ReplayConfig(capacity=1000))
    >>> buffer.placement
    'direct'
"""

from __future__ import annotations

import contextvars
import importlib
import os
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

from transports.kernel import placements
from transports.kinds import normalize_transport_kind


def normalize_placement(value: object, *, path: str | None = None) -> str:
    """The canonical placement name for ``value``, among the registered placements (the built-in ones register
    when their host modules are imported: here, on first use, so that importing ``components`` stays light).

    Raises:
        ConfigurationError: ``value`` is not a registered placement.
    """
    importlib.import_module("components.hosts")  # registers the built-in placements
    return placements.normalize_placement(value, path=path)


@dataclass(frozen=True)
class Scoped:
    """A scoped default: its canonical value, where it came from (for messages), and the setting process."""

    value: str
    origin: str
    pid: int


_SERVICE: contextvars.ContextVar[Scoped | None] = contextvars.ContextVar("service_backend", default=None)
_TRANSPORT: contextvars.ContextVar[Scoped | None] = contextvars.ContextVar("transport_backend", default=None)


@contextmanager
def service_backend(name: str, *, origin: str | None = None) -> Iterator[None]:
    """Make ``name`` the default placement of owners constructed in this context.

    Args:
        name: a placement (``direct``, ``thread``, ``process``, ``ray``, ``distributed``; aliases accepted).
        origin: how to describe this default in error messages (defaults to ``service_backend('<name>')``).

    Raises:
        ConfigurationError: ``name`` is not a placement.
    """
    scoped = Scoped(normalize_placement(name), origin or f"service_backend({name!r})", os.getpid())
    token = _SERVICE.set(scoped)
    try:
        yield
    finally:
        _SERVICE.reset(token)


@contextmanager
def transport_backend(name: str, *, origin: str | None = None) -> Iterator[None]:
    """Make ``name`` the default transport of owners constructed in this context.

    Components still validate the transport against their placement; an error caused by this default says so.

    Args:
        name: a transport kind (``auto``, ``direct``, ``thread``, ``queue``, ``shared_memory``...).
        origin: how to describe this default in error messages (defaults to ``transport_backend('<name>')``).

    Raises:
        ConfigurationError: ``name`` is not a transport kind.
    """
    scoped = Scoped(normalize_transport_kind(name), origin or f"transport_backend({name!r})", os.getpid())
    token = _TRANSPORT.set(scoped)
    try:
        yield
    finally:
        _TRANSPORT.reset(token)


def _live(var: contextvars.ContextVar[Scoped | None]) -> Scoped | None:
    scoped = var.get()
    if scoped is None or scoped.pid != os.getpid():
        return None
    return scoped


def current_service_backend() -> Scoped | None:
    """The scoped placement default in effect here, or ``None``."""
    return _live(_SERVICE)


def current_transport_backend() -> Scoped | None:
    """The scoped transport default in effect here, or ``None``."""
    return _live(_TRANSPORT)


@dataclass(frozen=True)
class Choice:
    """A resolved setting and where it came from: ``explicit``, a scoped default's origin, or ``default``."""

    value: str
    origin: str

    @property
    def from_context(self) -> bool:
        """Whether a scoped default chose the value (neither an explicit argument nor the default)."""
        return self.origin not in ("explicit", "default")


def choose_placement(explicit: str | None, default: str, *, path: str | None = None) -> Choice:
    """explicit argument > ``service_backend`` context > ``default``."""
    if explicit is not None:
        return Choice(normalize_placement(explicit, path=path), "explicit")
    scoped = current_service_backend()
    if scoped is not None:
        return Choice(scoped.value, scoped.origin)
    return Choice(normalize_placement(default), "default")


def choose_transport(explicit: str | None, default: str = "auto", *, path: str | None = None) -> Choice:
    """explicit argument (``auto`` included) > ``transport_backend`` context > ``default``."""
    if explicit is not None:
        return Choice(normalize_transport_kind(explicit, path=path), "explicit")
    scoped = current_transport_backend()
    if scoped is not None:
        return Choice(scoped.value, scoped.origin)
    return Choice(normalize_transport_kind(default), "default")
