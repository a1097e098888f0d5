"""One resolution per component: where its owner lives, how its payloads move and why, its layouts, options
and resources. The plan builds one `Resolved` per component and every owner is built from it; an owner
built from Python without one computes the same object once, through `resolve_component`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from transports import registry as transport_registry
from transports.config import TransportConfig
from transports.kernel.errors import ConfigurationError, NotImplementedYetError
from transports.resolver import TransportContext

from . import compat
from .hosts import HOSTS, Resources, host_class
from .scope import choose_placement, choose_transport


@dataclass(frozen=True)
class Resolved:
    """Everything an owner is built from, as data (printable, comparable, picklable).

    Attributes:
        component: the component's name.
        placement: where its owner lives.
        placement_from: where that came from (``explicit``, a config path, a scoped default, ``default``).
        transport: the resolved transport kind (``-`` for components that take none).
        transport_reason: ``explicit``, or why ``auto`` (or a broad default) chose it.
        transport_options: keyword options of the transport.
        status: `SUPPORTED` or `NOT_YET`.
        resources: what its host may use.
        layouts: wire layouts by name (``request``, ``response``) where they are known up front.
        config: the component's config object (its declaration's config dataclass): placement, transport and
            resources as asked for, and the component's own options, the recipe's needs included. The owner is
            built from it.
        depends_on: components it needs started first (set by the plan).
    """

    component: str
    placement: str
    placement_from: str
    transport: str
    transport_reason: str
    transport_options: Mapping[str, Any] = field(default_factory=dict)
    status: str = compat.SUPPORTED
    resources: Resources = field(default_factory=Resources)
    layouts: Mapping[str, Any] = field(default_factory=dict)
    config: Any = None
    depends_on: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        """The component's name (the plan's key for it)."""
        return self.component

    @property
    def options(self) -> dict[str, Any]:
        """The component's own options (its config's fields beside placement, transport and resources)."""
        return {} if self.config is None else self.config.options()

    @property
    def built(self) -> bool:
        """Whether this (component, placement, transport) cell is built."""
        return self.status == compat.SUPPORTED

    def ensure_built(self) -> None:
        """Raise `NotImplementedYetError` if this cell of the table (or its host) is not built yet."""
        compat.ensure_built(self.component, self.placement, self.transport,
                            path=f"components.{self.component}.placement")
        if self.placement not in HOSTS:
            raise NotImplementedYetError(f"{self.component} placed on {self.placement!r}: no host is built for "
                                         f"this placement yet", alternatives=tuple(HOSTS))

    @property
    def transport_config(self) -> TransportConfig:
        """The chosen transport as a value (its kind and options)."""
        return TransportConfig(self.transport, dict(self.transport_options))

    @property
    def host(self):
        """The host class of this placement."""
        return host_class(self.placement)


def resolve_component(
    component: str,
    placement: str | None = None,
    transport: Any = None,
    *,
    transport_options: Mapping[str, Any] | None = None,
    layouts: Mapping[str, Any] | None = None,
    layouts_known: bool | None = None,
    config: Any = None,
    resources: Any = None,
    placement_path: str | None = None,
    transport_path: str | None = None,
    one_request_per_worker: bool = False,
) -> Resolved:
    """Resolve one component: explicit value > ``service_backend`` / ``transport_backend`` scope > default; check
    the combination against the table, the transport's options and layouts, the component's config and its
    resources. Starts nothing.

    Args:
        component: a name from `components.compat.COMPONENTS`.
        placement: explicit placement (``None``: the scope, else the component's default).
        transport: explicit kind or `TransportConfig` (``None``: the scope, else ``auto``).
        transport_options: options merged over those of a `TransportConfig`.
        layouts: known wire layouts (``request``/``response``).
        layouts_known: whether fixed layouts will be given (default: whether ``layouts`` holds both).
        config: the component's config object (default: its config dataclass's defaults); its own ranges and rules
            are checked when it is made, what they cannot say by the declaration.
        resources: a `Resources`, or a mapping of its fields (default: the config's).
        placement_path: config path of the placement setting, for messages.
        transport_path: config path of the transport setting, for messages.
        one_request_per_worker: its callers keep one request in flight per worker (steers ``auto``).

    Raises:
        ConfigurationError: anything outside the table or out of range, naming the config path.
    """
    declaration = compat.declaration(component)
    config = declaration.config() if config is None else config
    if resources is None:
        resources = config.resources
    layouts = dict(layouts or {})
    known = ("request" in layouts and "response" in layouts) if layouts_known is None else layouts_known
    p = choose_placement(placement, declaration.default_placement, path=placement_path)
    cell = compat.get_cell(component, p.value, path=placement_path, origin=p.origin)
    kind = transport.kind if isinstance(transport, TransportConfig) else transport
    t = choose_transport(kind, path=transport_path)
    given = dict(transport.options) if isinstance(transport, TransportConfig) else {}
    requested = TransportConfig(t.value, {**given, **(transport_options or {})})
    resolution = compat.resolve(
        component, requested,
        TransportContext(p.value, layouts_known=known, one_request_per_worker=one_request_per_worker,
                         path=transport_path, origin=t.origin),
        placement_explicit=p.origin == "explicit",
    )
    t_path = transport_path or f"components.{component}.transport"
    if resolution.kind != compat.NO_TRANSPORT:
        if declaration.layouts_up_front and not cell.discovers_layouts:
            transport_registry.check_layouts(resolution.kind, known, path=t_path)
        transport_registry.check_options(resolution.kind, resolution.options,
                                         path=f"components.{component}.transport_options")
    inline = p.value in HOSTS and host_class(p.value).inline
    if declaration.check is not None:
        declaration.check(config, inline=inline)
    try:
        resources = Resources.of(resources)
        if p.value in HOSTS:
            host_class(p.value).check_resources(resources)
    except ConfigurationError as exc:
        raise ConfigurationError(f"{component}.{exc.message}", path=f"components.{component}.{exc.path}") from None
    return Resolved(
        component=component,
        placement=p.value,
        placement_from=placement_path if p.origin == "explicit" and placement_path else p.origin,
        transport=resolution.kind,
        transport_reason=resolution.reason,
        transport_options=dict(resolution.options),
        status=compat.status(component, p.value, resolution.kind),
        resources=resources,
        layouts=layouts,
        config=config,
    )
