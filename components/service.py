"""The owner/client contract every service keeps.

An *owner* constructs and owns a heavy resource (a policy, a storage, a logging SDK) and controls its
lifecycle; a *client* is the cheap, picklable capability workers get, with domain operations only.

Owner contract:
    - ``start()`` returns ``self`` only once the resource is constructed and ready; starting twice raises.
    - ``shutdown(timeout=None)`` is idempotent and safe on error paths (also before ``start``).
    - ``client()`` returns the client; when the resource lives in the caller (``direct``) the client *is* the owner.
    - ``is_alive`` says whether the resource is serving; owners are context managers.

Every owner is built from one `Resolved` (the plan's, or one it computes from its
arguments) and runs its resource on the host of its placement: the owner supplies the target to host and,
where clients reach it through a transport, the endpoint's kind; the host and the transport do the rest.

Every owner is called the same way: ``Owner(config, *, dependencies..., transport=None, resolved=None)``. The
component's config dataclass is the one positional argument and the one source of its options; what the owner is
built *with* (a policy, an env factory, a template, a backend, a weight-sync client) comes by keyword.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import threading
from typing import Any, Callable, ClassVar, Generic, Protocol, TypeVar, runtime_checkable

from transports import registry as transport_registry

from . import compat
from .declaration import COMMANDS, SELF, Binding
from .hosts import Host, Resources
from .resolution import Resolved, resolve_component

ClientT = TypeVar("ClientT", covariant=True)

LIFECYCLE_METHODS: tuple[str, ...] = ("start", "shutdown", "close")
"""Names a remote client must not expose: clients never stop shared infrastructure."""


def owner_parameters(owner: type) -> list[inspect.Parameter]:
    """The parameters of owner class ``owner``'s constructor, ``self`` left out."""
    return list(inspect.signature(owner.__init__).parameters.values())[1:]


@functools.lru_cache(maxsize=None)
def _usage(owner: type) -> str:
    keywords = [f"{p.name}=" for p in owner_parameters(owner) if p.kind is p.KEYWORD_ONLY]
    return f"{owner.__name__}(config, *, {', '.join(keywords)})"


def check_call(owner: type, args: tuple, kwargs: dict) -> None:
    """Refuse a call of owner class ``owner`` outside the one convention, naming the owner and the argument.

    Raises:
        TypeError: more than one positional argument, a first one that is not the component's config, a config
            field given as a keyword, or a keyword the owner does not take.
    """
    if not owner.component:
        return
    config_class = compat.declaration(owner.component).config
    if len(args) > 1:
        raise TypeError(f"{owner.__name__} takes its config as its one positional argument and every dependency by "
                        f"keyword: got {len(args)} positional arguments; call {_usage(owner)}")
    if args and args[0] is not None and not isinstance(args[0], config_class):
        raise TypeError(f"{owner.__name__}'s positional argument is its config ({config_class.__name__}), got "
                        f"{type(args[0]).__name__}: pass dependencies by keyword, {_usage(owner)}")
    taken = {p.name for p in owner_parameters(owner)}
    for name in kwargs:
        if name in taken:
            continue
        if name in {f.name for f in dataclasses.fields(config_class)}:
            raise TypeError(f"{owner.__name__} got {name}=, a field of {config_class.__name__}: options live in the "
                            f"config, {owner.__name__}({config_class.__name__}({name}=...))")
        raise TypeError(f"{owner.__name__} got an unexpected keyword argument {name!r}; call {_usage(owner)}")


@runtime_checkable
class Service(Protocol[ClientT]):
    """What the launcher relies on: the owner side of a service."""

    def start(self) -> "Service[ClientT]":
        """Build the resource and return the service once it is ready."""

    def shutdown(self, timeout: float | None = None) -> None:
        """Stop the service and release its resources; idempotent, safe before ``start``."""

    def client(self) -> ClientT:
        """The capability to hand to workers (the owner itself when the resource lives in the caller)."""

    @property
    def is_alive(self) -> bool:
        """Whether the owned resource is serving."""


class Owner(Generic[ClientT]):
    """Base class of owners: one resolution, one host, one transport, and the lifecycle.

    Subclasses set `component` and implement `_target` (a picklable factory of what the host runs)
    and, for owners reached through a transport, `_wrap` (the client over a transport endpoint). Owners
    with several hosts (collectors) override `_launch`, `_finish`, `_shutdown` and
    `_alive`.

    One calling convention for every owner: ``Owner(config=None, *, dependencies..., transport=None,
    resolved=None)``. ``config`` is the component's config dataclass (its declaration's ``config``), positional
    and optional (``None``: the dataclass's defaults); every other argument is keyword-only: the dependencies the
    owner is built with (``policy_factory=``, ``create_env_fn=``, ``template=``, ``backend=``...), then
    ``transport=`` where the component takes one, then ``resolved=``. Options live only in the config: an owner
    takes no config field as a keyword (``ReplayBuffer(ReplayConfig(capacity=1000))``, not
    ``ReplayBuffer(capacity=1000)``), so a keyword is always a dependency and a setting has one place. A call
    outside the convention (a dependency passed positionally, a config field or an unknown keyword) raises a
    ``TypeError`` naming the owner and the argument before anything is built.

    Args:
        config: the component's config object (its declaration's config dataclass; ``None``: its defaults):
            placement (``None`` takes the ``service_backend`` context, else the default), transport (``None`` takes
            the ``transport_backend`` context, else ``auto``), transport options, resources and the component's own
            options.
        transport: overrides ``config.transport``: a kind, a `TransportConfig` or a transport
            instance (validated like a name).
        layouts_known: whether fixed payload layouts are known up front (steers ``auto``).
        resolved: the plan's resolution of this component (then ``config`` and ``transport`` are not read: the
            resolution holds the config).

    Attributes:
        config: the config the owner was built from (``resolved.config``).
    """

    component: ClassVar[str] = ""

    def __new__(cls, *args: Any, **kwargs: Any):
        check_call(cls, args, kwargs)
        return super().__new__(cls)

    def __init__(self, config: Any = None, *, transport: Any = None, layouts_known: bool = False,
                 resolved: Resolved | None = None):
        from transports.base import Transport  # tensordict: only once an owner is built

        self._injected: Transport | None = transport if isinstance(transport, Transport) else None
        if resolved is None:
            config = compat.declaration(self.component).config() if config is None else config
            requested = config.transport if transport is None else transport
            kind = self._injected.config if self._injected is not None else requested
            resolved = resolve_component(self.component, config.placement, kind,
                                         transport_options=config.transport_options, layouts_known=layouts_known,
                                         config=config)
        resolved.ensure_built()
        self.resolved = resolved
        self.config = resolved.config
        self.host_type: type[Host] = resolved.host
        self.resources: Resources = resolved.resources
        self._host: Host | None = None
        self._transport: Any = None
        self._payload: Any = None  # a payload transport beside the command transport (see _payload_transport)
        self._state = "new"
        self._state_lock = threading.Lock()

    # ------------------------------------------------------------------ introspection
    @property
    def placement(self) -> str:
        """The resolved placement."""
        return self.resolved.placement

    @property
    def transport_kind(self) -> str:
        """The resolved transport kind (``-`` for components that take none)."""
        return self.resolved.transport

    @property
    def transport_config(self):
        """The resolved transport as a `TransportConfig`."""
        return self.resolved.transport_config

    @property
    def transport_reason(self) -> str:
        """Why this transport: ``explicit``, or the ``auto`` rule that chose it."""
        return self.resolved.transport_reason

    @property
    def descriptor(self):
        """The resolved transport's `TransportDescriptor` (``None`` for components that
        take none)."""
        if self._injected is not None:
            return self._injected.descriptor
        return transport_registry.find(self.transport_kind)

    @property
    def binding(self) -> Binding:
        """How this component uses its resolved transport (declared beside its cells: ``Declaration.bindings``)."""
        return compat.declaration(self.component).binding(self.transport_kind)

    @property
    def host(self) -> Host | None:
        """The host running the resource (its ``pid`` or actor ``handle``), once started."""
        return self._host

    def all_hosts(self) -> list[Host]:
        """Every host running a part of the resource, once started (a collector has one per worker)."""
        return [self._host] if self._host is not None else []

    @property
    def inline(self) -> bool:
        """Whether the resource lives in the caller's thread (the owner is then its own client)."""
        return self.host_type.inline

    def with_resources(self, resources: Any) -> "Owner":
        """Set what the owner's host may use (a `Resources`, or a mapping with its
        fields); before ``start``. Hosts without reservations ignore what they cannot use."""
        if self._state != "new":
            raise RuntimeError(f"{type(self).__name__}.with_resources() must come before start()")
        self.resources = Resources.of(resources)
        return self

    # ------------------------------------------------------------------ lifecycle
    def start(self):
        """Build the resource and return ``self`` once it is ready (`launch`, then `wait_ready`).

        Raises:
            RuntimeError: the owner was already started (or shut down).
        """
        return self.launch().wait_ready()

    def launch(self):
        """Begin building the resource without waiting for it to be ready, so owners that do not depend on each
        other start at the same time; `wait_ready` completes the start. Returns ``self``.

        Raises:
            RuntimeError: the owner was already started (or shut down).
        """
        with self._state_lock:
            if self._state != "new":
                raise RuntimeError(f"{type(self).__name__}.start() called twice (state: {self._state})")
            self._state = "starting"
        self._guarded(self._launch)
        return self

    def wait_ready(self):
        """Return ``self`` once the launched resource is ready; on error it is torn down and the error raised.

        Raises:
            RuntimeError: the owner was not launched.
        """
        if self._state != "starting":
            raise RuntimeError(f"{type(self).__name__}.wait_ready() needs a launched owner (state: {self._state})")
        self._guarded(self._finish)
        self._state = "running"
        return self

    def _guarded(self, step: Callable[[], None]) -> None:
        try:
            step()
        except BaseException:
            self._state = "stopping"
            try:
                self._shutdown(None)
            finally:
                self._state = "stopped"
            raise

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
        """The capability to hand to workers (the owner itself when the resource lives in the caller).

        Raises:
            RuntimeError: the owner is not running.
        """
        if self._state != "running":
            raise RuntimeError(f"{type(self).__name__}.client() needs a started owner (state: {self._state})")
        if self.inline:
            return self  # type: ignore[return-value]
        return self._client()

    def __enter__(self):
        if self._state == "new":
            self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    # ------------------------------------------------------------------ the one way owners run
    def _launch(self) -> None:
        """Build the endpoint's transport (unless the resource lives in the caller) and launch the host."""
        if not self.inline:
            self._transport = self._make_transport()
            self._payload = self._payload_transport()
        server_side = None if self._transport is None else self._transport.server_side()
        factory = self._target(server_side)
        if factory is not None:
            self._host = self._make_host(self.component.replace("_", "-"), factory, self._concurrency())
            self._host.launch()

    def _finish(self) -> None:
        """Wait for the host's ready handshake, then bind the transport to it."""
        if self._host is not None:
            self._host.wait_ready()
            for transport in self._transports():
                transport.bind(self._host)
        self._ready()

    def _make_transport(self) -> Any:
        """The request/reply transport clients reach the target through (``None``: they need none)."""
        if self._injected is not None:
            return self._injected
        kind, options = self._endpoint()
        if kind is None:
            return None
        return transport_registry.build(kind, options, name=self.component, **self._layouts())

    def _transports(self) -> list:
        return [t for t in (self._transport, self._payload) if t is not None]

    def _make_host(self, name: str, factory: Callable[[], Any], concurrency: int = 1,
                   index: tuple[int, int] = (0, 1)) -> Host:
        transports = self._transports()

        def on_death(reason: str) -> None:
            for transport in transports:
                transport.mark_dead(stopped=False)

        return self.host_type(name, factory, resources=self.resources, on_death=on_death if transports else None,
                              concurrency=concurrency, index=index)

    def _shutdown(self, timeout: float | None) -> None:
        if self._host is not None:
            self._host.shutdown(timeout)
        for transport in self._transports():
            transport.mark_dead(stopped=True)
            transport.close()

    def _alive(self) -> bool:
        return self._host is None or self._host.is_alive

    def _client(self) -> ClientT:
        return self._wrap(self._transport.client())

    # ------------------------------------------------------------------ for subclasses
    def _target(self, server_side: Any) -> Callable[[], Any] | None:
        """A picklable factory of what the host runs (called where the placement puts it), or ``None`` when
        nothing needs hosting; ``server_side`` is what the serving side of the endpoint's transport needs
        (``None`` when clients need no transport)."""
        raise NotImplementedError

    def _endpoint(self) -> tuple[str | None, dict]:
        """The transport kind and options of the endpoint clients use, as the binding says: the resolved transport
        itself, the host's command transport, another kind, or none."""
        endpoint = self.binding.endpoint
        if endpoint == SELF:
            return self.transport_kind, dict(self.resolved.transport_options)
        if endpoint == COMMANDS:
            return self.host_type.command_transport, {}
        return endpoint, {}

    def _payload_transport(self) -> Any:
        """The transport of bulk payloads beside the endpoint where the binding has one (a replay buffer's tensors
        over ``distributed`` while its other operations stay commands), else ``None``."""
        if not self.binding.payload:
            return None
        return transport_registry.build(self.transport_kind, self.resolved.transport_options, name=self.component,
                                        **self._payload_arguments())

    def _payload_arguments(self) -> dict:
        """What the payload transport takes beside its options (replay: its operations' explicit layouts)."""
        return {}

    def _concurrency(self) -> int:
        """Calls the target must take at once (a Ray actor serving batched requests needs several)."""
        return self.hosts_of(self.resolved)[0]

    @classmethod
    def hosts_of(cls, resolved: Resolved) -> tuple[int, ...]:
        """The hosts an owner of ``resolved`` launches, as the calls each must take at once (one entry per host), for
        a placement that starts their processes ahead (`components.hosts.base.Host.warm`). By default: one
        host taking one call at a time."""
        return (1,)

    def _layouts(self) -> dict:
        """Layouts a fixed-layout transport is built with (``request_layout``, ``response_layout``)."""
        return {}

    def _ready(self) -> None:
        """Called once the host (if any) is ready and the transport bound."""

    def _wrap(self, endpoint: Any) -> ClientT:
        raise NotImplementedError(f"{type(self).__name__} has no remote client for placement {self.placement!r}")

    def _require_running(self) -> None:
        if self._state != "running":
            raise RuntimeError(f"{type(self).__name__} is not running (state: {self._state}); call start() first")

    def __reduce_ex__(self, protocol):
        # Owners hold the resource and its lifecycle: they stay where they were created. A direct owner is
        # its own client, so this is also what pickling a direct client says.
        hint = (
            f"a {self.placement!r} owner is its own client and works only inside its process; place it on 'thread', "
            "'process' or 'ray' to share it across processes"
            if self.inline
            else "pass owner.client() to workers instead"
        )
        raise TypeError(f"cannot pickle {type(self).__name__} (placement {self.placement!r}): {hint}")
