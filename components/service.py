"""The owner/client contract every service keeps.

An *owner* constructs and owns a heavy resource (a policy, a storage, a logging SDK) and controls its
lifecycle; a *client* is the cheap, picklable capability workers get, with domain operations only.

Owner contract:
    - ``start()`` returns ``self`` only once the resource is constructed and ready; starting twice raises.
    - ``shutdown(timeout=None)`` is idempotent and safe on error paths (also before ``start``).
    - ``client()`` returns the client; for ``direct`` placement the client *is* the owner.
    - ``is_alive`` says whether the resource is serving; owners are context managers.
"""

from __future__ import annotations

import threading
from typing import Any, ClassVar, Generic, Protocol, TypeVar, runtime_checkable

from transports.config import TransportConfig
from transports.resolver import Resolution, TransportContext

from . import compat
from .scope import Choice, choose_placement, choose_transport

ClientT = TypeVar("ClientT", covariant=True)

LIFECYCLE_METHODS: tuple[str, ...] = ("start", "shutdown", "close")
"""Names a remote client must not expose: clients never stop shared infrastructure."""


@runtime_checkable
class Service(Protocol[ClientT]):
    """What the launcher relies on: the owner side of a service."""

    def start(self) -> "Service[ClientT]": ...

    def shutdown(self, timeout: float | None = None) -> None: ...

    def client(self) -> ClientT: ...

    @property
    def is_alive(self) -> bool: ...


class Owner(Generic[ClientT]):
    """Base class of owners: placement/transport resolution against the table, and the lifecycle.

    Subclasses set :attr:`component`, implement :meth:`_start` (build the resource; return when ready),
    :meth:`_shutdown` and, for remote placements, :meth:`_client`.

    Args:
        placement: where the owner lives; ``None`` takes the ``service_backend`` context, else
            :attr:`default_placement`.
        transport: a kind or :class:`~transports.TransportConfig`; ``None`` takes the ``transport_backend``
            context, else ``auto``.
        layouts_known: whether fixed payload layouts are known up front (steers ``auto``).
    """

    component: ClassVar[str] = ""
    default_placement: ClassVar[str] = "direct"

    def __init__(self, *, placement: str | None = None, transport: Any = None, layouts_known: bool = False):
        self._placement_choice: Choice = choose_placement(placement, self.default_placement)
        if transport is None or isinstance(transport, str):
            requested = None
            t_choice = choose_transport(transport)
        else:  # a TransportConfig, or a transport instance: validated against the placement like a name
            requested = transport if isinstance(transport, TransportConfig) else TransportConfig(transport.kind)
            t_choice = choose_transport(requested.kind)
        context = TransportContext(
            self._placement_choice.value,
            layouts_known=layouts_known,
            origin=t_choice.origin,
        )
        compat.get_cell(self.component, context.placement, origin=self._placement_choice.origin)
        self._resolution: Resolution = compat.resolve(
            self.component,
            requested if requested is not None else t_choice.value,
            context,
            strict=not t_choice.from_context,
        )
        compat.ensure_built(self.component, self.placement, self.transport_kind)
        self.resources: Any = None  # what a ray owner's actors reserve (ActorResources); see with_resources
        self._state = "new"
        self._state_lock = threading.Lock()

    # ------------------------------------------------------------------ introspection
    @property
    def placement(self) -> str:
        """The resolved placement."""
        return self._placement_choice.value

    @property
    def transport_kind(self) -> str:
        """The resolved transport kind (``-`` for components that take none)."""
        return self._resolution.kind

    @property
    def transport_config(self):
        """The resolved transport as a :class:`~transports.TransportConfig`."""
        return self._resolution.config

    @property
    def transport_reason(self) -> str:
        """Why this transport: ``explicit``, or the ``auto`` rule that chose it."""
        return self._resolution.reason

    def with_resources(self, resources: Any) -> "Owner":
        """Set what the owner's actors reserve where it is placed (a
        :class:`~components.ray_support.ActorResources`, or a mapping with its fields); before ``start``.
        Placements without actors ignore it."""
        if self._state != "new":
            raise RuntimeError(f"{type(self).__name__}.with_resources() must come before start()")
        from .ray_support import ActorResources

        self.resources = resources if isinstance(resources, ActorResources) else ActorResources.from_config(resources)
        return self

    # ------------------------------------------------------------------ lifecycle
    def start(self):
        """Build the resource and return ``self`` once it is ready.

        Raises:
            RuntimeError: the owner was already started (or shut down).
        """
        with self._state_lock:
            if self._state != "new":
                raise RuntimeError(f"{type(self).__name__}.start() called twice (state: {self._state})")
            self._state = "starting"
        try:
            self._start()
        except BaseException:
            self._state = "stopping"
            try:
                self._shutdown(None)
            finally:
                self._state = "stopped"
            raise
        self._state = "running"
        return self

    def shutdown(self, timeout: float | None = None) -> None:
        """Stop the service and release its resources. Idempotent; safe before ``start``."""
        with self._state_lock:
            if self._state in ("stopping", "stopped"):
                return
            was = self._state
            self._state = "stopping"
        try:
            if was != "new":
                self._shutdown(timeout)
        finally:
            self._state = "stopped"

    @property
    def is_alive(self) -> bool:
        """Whether the owned resource is serving."""
        return self._state == "running" and self._alive()

    def client(self) -> ClientT:
        """The capability to hand to workers (the owner itself for ``direct`` placement).

        Raises:
            RuntimeError: the owner is not running.
        """
        if self._state != "running":
            raise RuntimeError(f"{type(self).__name__}.client() needs a started owner (state: {self._state})")
        if self.placement == "direct":
            return self  # type: ignore[return-value]
        return self._client()

    def __enter__(self):
        if self._state == "new":
            self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    # ------------------------------------------------------------------ for subclasses
    def _start(self) -> None:
        """Construct the resource; return only when it is ready."""

    def _shutdown(self, timeout: float | None) -> None:
        """Release the resource."""

    def _alive(self) -> bool:
        return True

    def _client(self) -> ClientT:
        raise NotImplementedError(f"{type(self).__name__} has no remote client for placement {self.placement!r}")

    def _require_running(self) -> None:
        if self._state != "running":
            raise RuntimeError(f"{type(self).__name__} is not running (state: {self._state}); call start() first")

    def __reduce_ex__(self, protocol):
        # Owners hold the resource and its lifecycle: they stay where they were created. A direct owner is
        # its own client, so this is also what pickling a direct client says.
        hint = (
            "a 'direct' owner is its own client and works only inside its process; place it on 'thread', "
            "'process' or 'ray' to share it across processes"
            if self.placement == "direct"
            else "pass owner.client() to workers instead"
        )
        raise TypeError(f"cannot pickle {type(self).__name__} (placement {self.placement!r}): {hint}")
