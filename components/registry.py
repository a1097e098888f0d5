"""Discovery: find services by name.

Passing clients explicitly is preferable when destinations are known up front; a registry helps when
independently created workers must locate a service. Registering a *factory* makes the registry the owner
(it starts the service and shuts it down on ``reset``). Registering a *running owner* stores only its client
and never transfers ownership: ``reset`` forgets it without stopping it.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

from .service import Owner


class ServiceRegistry:
    """A process-local, dict-like registry of services.

    Example:
        >>> registry = ServiceRegistry()
        >>> registry.register("replay", ReplayBuffer, capacity=10_000)     # the registry owns this one
        >>> registry.register("logger", logger_owner)                      # only its client is stored
        >>> registry.get_client("replay").sample()
        >>> registry.reset()                                               # stops "replay", forgets "logger"
    """

    def __init__(self) -> None:
        self._entries: dict[str, tuple[Any, Any, bool]] = {}  # name -> (owner or None, client, owned)
        self._lock = threading.Lock()

    def register(self, name: str, service: Owner | Callable[..., Owner], *args: Any, **kwargs: Any) -> Any:
        """Register ``service`` under ``name`` and return its client.

        Args:
            name: a unique name.
            service: a running owner (its client is stored; ownership stays with the caller) or a factory
                (a class or callable returning an owner) that the registry calls with ``args``/``kwargs``,
                starts, and owns.

        Raises:
            ValueError: ``name`` is taken, or ``service`` is an owner that is not running.
            TypeError: ``service`` is neither an owner nor callable.
        """
        with self._lock:
            if name in self._entries:
                raise ValueError(f"a service named {name!r} is already registered")
        if isinstance(service, Owner):
            if args or kwargs:
                raise TypeError("arguments are for factories; a running owner is registered as it is")
            if not service.is_alive:
                raise ValueError(f"cannot register {type(service).__name__} as {name!r}: it is not running (start it first)")
            entry = (None, service.client(), False)
        elif callable(service):
            owner = service(*args, **kwargs)
            if not isinstance(owner, Owner):
                raise TypeError(f"the factory for {name!r} returned {type(owner).__name__}, not a service owner")
            owner.start()
            entry = (owner, owner.client(), True)
        else:
            raise TypeError(f"register needs a running owner or a factory, got {type(service).__name__}")
        with self._lock:
            if name in self._entries:  # registered concurrently while we were starting
                if entry[2]:
                    entry[0].shutdown()
                raise ValueError(f"a service named {name!r} is already registered")
            self._entries[name] = entry
        return entry[1]

    def get(self, name: str) -> Any:
        """The owner of a registry-owned service, or the client of an external one.

        Raises:
            KeyError: no such name.
        """
        owner, client, owned = self._entry(name)
        return owner if owned else client

    def get_client(self, name: str) -> Any:
        """The restricted client of ``name``.

        Raises:
            KeyError: no such name.
        """
        return self._entry(name)[1]

    def _entry(self, name: str):
        with self._lock:
            try:
                return self._entries[name]
            except KeyError:
                raise KeyError(f"no service named {name!r} (registered: {sorted(self._entries)})") from None

    def list(self) -> list[str]:
        with self._lock:
            return sorted(self._entries)

    def reset(self) -> None:
        """Forget every entry; shut down only the services this registry created."""
        with self._lock:
            entries, self._entries = self._entries, {}
        for owner, _, owned in reversed(list(entries.values())):
            if owned:
                owner.shutdown()

    def __contains__(self, name: str) -> bool:
        with self._lock:
            return name in self._entries

    def __getitem__(self, name: str) -> Any:
        return self.get(name)

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)
