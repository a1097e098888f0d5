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

    Examples:
        >>> registry = ServiceRegistry()
        >>> registry.register("replay", ReplayBuffer, ReplayConfig(capacity=10_000))  # the registry owns this one
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
        if name in self:
            raise ValueError(f"a service named {name!r} is already registered")
        entry = self._make_entry(name, service, args, kwargs)
        if not self._store(name, entry):  # registered concurrently while we were starting
            if entry[2]:
                entry[0].shutdown()
            raise ValueError(f"a service named {name!r} is already registered")
        return entry[1]

    def _make_entry(self, name: str, service: Any, args: tuple, kwargs: dict) -> tuple[Any, Any, bool]:
        if isinstance(service, Owner):
            if args or kwargs:
                raise TypeError("arguments are for factories; a running owner is registered as it is")
            if not service.is_alive:
                raise ValueError(f"cannot register {type(service).__name__} as {name!r}: it is not running (start it first)")
            self._check_owner(name, service)
            return (None, service.client(), False)
        if callable(service):
            owner = service(*args, **kwargs)
            if not isinstance(owner, Owner):
                raise TypeError(f"the factory for {name!r} returned {type(owner).__name__}, not a service owner")
            self._check_owner(name, owner)
            owner.start()
            return (owner, owner.client(), True)
        raise TypeError(f"register needs a running owner or a factory, got {type(service).__name__}")

    def _check_owner(self, name: str, owner: Owner) -> None:
        """Refuse owners whose clients cannot reach this registry's users (every owner, here)."""

    def _store(self, name: str, entry: tuple) -> bool:
        with self._lock:
            if name in self._entries:
                return False
            self._entries[name] = entry
            return True

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
        """The registered names, sorted."""
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


class RayServiceRegistry(ServiceRegistry):
    """A registry in a Ray namespace: any process connected to the cluster finds a service by name.

    The names and clients live in a small named actor of the namespace (created by the first registry that
    needs it), so independently started workers call ``RayServiceRegistry().get_client("replay")``. Only
    owners placed on ``ray`` can be registered (their clients reach the whole cluster). As with
    `ServiceRegistry`, a registered running owner keeps its owner: ``reset`` only shuts down the
    services this registry instance created, and forgets the names it registered.

    Args:
        namespace: the Ray namespace (default: the connection's).
        directory: name of the directory actor.
    """

    DIRECTORY = "rl_services_registry"

    def __init__(self, namespace: str | None = None, directory: str = DIRECTORY) -> None:
        super().__init__()
        from .hosts.ray import namespace as current_namespace, require_connection

        ray = require_connection("RayServiceRegistry")
        self.namespace = namespace or current_namespace()
        self._directory = ray.remote(_Directory).options(
            name=directory, namespace=self.namespace, get_if_exists=True, num_cpus=0, max_concurrency=8,
        ).remote()
        self._mine: dict[str, tuple[Any, bool]] = {}  # names this instance registered -> (owner or None, owned)

    def _check_owner(self, name: str, owner: Owner) -> None:
        from transports.kernel.placements import Reach

        if owner.descriptor is None or owner.descriptor.reach < Reach.NETWORK:  # e.g. a process owner: clients stay local
            raise ValueError(
                f"cannot register {type(owner).__name__} as {name!r} in a RayServiceRegistry: it is placed on "
                f"{owner.placement!r}, and only owners placed on 'ray' have clients that reach the cluster"
            )

    def _ask(self, method: str, *args: Any) -> Any:
        from transports.ray import get

        return get(getattr(self._directory, method).remote(*args), f"registry.{method}", 60.0)

    def _store(self, name: str, entry: tuple) -> bool:
        if not self._ask("put", name, entry[1]):
            return False
        with self._lock:
            self._mine[name] = (entry[0], entry[2])
        return True

    def get(self, name: str) -> Any:
        with self._lock:
            mine = self._mine.get(name)
        if mine is not None and mine[1]:
            return mine[0]
        return self.get_client(name)

    def get_client(self, name: str) -> Any:
        found, client = self._ask("get", name)
        if not found:
            raise KeyError(f"no service named {name!r} in namespace {self.namespace!r} (registered: {self.list()})")
        return client

    def list(self) -> list[str]:
        """The names registered in this namespace (by any process of the cluster), sorted."""
        return sorted(self._ask("names"))

    def reset(self) -> None:
        """Forget the names this instance registered; shut down only the services it created."""
        with self._lock:
            mine, self._mine = self._mine, {}
        if mine:
            self._ask("remove", list(mine))
        for owner, owned in reversed(list(mine.values())):
            if owned:
                owner.shutdown()

    def __contains__(self, name: str) -> bool:
        return name in self._ask("names")

    def __len__(self) -> int:
        return len(self._ask("names"))


class _Directory:
    """The named actor behind `RayServiceRegistry`: names -> clients."""

    def __init__(self) -> None:
        self.entries: dict[str, Any] = {}
        self.lock = threading.Lock()

    def put(self, name: str, client: Any) -> bool:
        with self.lock:
            if name in self.entries:
                return False
            self.entries[name] = client
            return True

    def get(self, name: str) -> tuple[bool, Any]:
        with self.lock:
            return (name in self.entries, self.entries.get(name))

    def names(self) -> list:
        with self.lock:
            return list(self.entries)

    def remove(self, names: list) -> None:
        with self.lock:
            for name in names:
                self.entries.pop(name, None)
