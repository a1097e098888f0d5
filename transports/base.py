"""The small base every payload transport implements.

A transport connects clients to one owner. It is created by the owner side, hands out picklable client
endpoints with :meth:`Transport.client`, and releases what it holds with :meth:`Transport.close`
(idempotent). What travels, and how requests are answered, is the concern of the domain (inference,
replay, ...) built on top; this base only fixes the lifecycle vocabulary and the introspection that plans
and error messages use.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

from .config import TransportConfig


class Transport(ABC):
    """Base class of payload transports.

    Subclasses set :attr:`kind` (a name from :data:`transports.kinds.TRANSPORT_KINDS`), state their rules
    in the class docstring, and implement :meth:`client` and :meth:`_close`.
    """

    kind: ClassVar[str] = "custom"

    def __init__(self) -> None:
        self._closed = False

    @abstractmethod
    def client(self) -> Any:
        """Return a new picklable client endpoint."""

    def close(self) -> None:
        """Release every resource of the transport. Safe to call more than once."""
        if self._closed:
            return
        self._closed = True
        self._close()

    def _close(self) -> None:
        """Release resources; called once by :meth:`close`."""

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def config(self) -> TransportConfig:
        """The transport as a value, for plans and messages."""
        return TransportConfig(self.kind, {})

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class DirectTransport(Transport):
    """In-process calls with no serialization boundary: the client is the owner's own callable.

    Rules: the client must stay in the owner's process (pickling it copies the owner's state).
    """

    kind = "direct"

    def __init__(self, target: Any = None) -> None:
        super().__init__()
        self._target = target

    def bind(self, target: Any) -> "DirectTransport":
        self._target = target
        return self

    def client(self) -> Any:
        if self._target is None:
            raise RuntimeError("DirectTransport.client() called before the transport was bound to an owner")
        return self._target

    def _close(self) -> None:
        self._target = None
