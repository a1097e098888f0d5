"""Per-domain transport resolution.

There is deliberately no cross-domain transport interface for *payloads*: inference, replay, logging and
weight sync move different things. What is shared is the selection step: each domain registers one
resolver that turns a requested :class:`TransportConfig` and a placement (plus what is known of the
payloads) into a :class:`Resolution`: the concrete kind and why it was chosen. ``auto`` is resolved
deterministically, and its reason is part of the answer so plans can show it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from .config import TransportConfig, as_transport_config
from .errors import ConfigurationError


@dataclass(frozen=True)
class TransportContext:
    """What a resolver may know about the topology when choosing.

    Args:
        placement: the owner's canonical placement.
        layouts_known: whether fixed wire layouts are available before the owner starts.
        one_request_per_worker: whether each client worker keeps at most one request in flight.
        path: the config path of the transport setting, for error messages.
        origin: where a non-explicit choice came from (a scoped default, a config value), for messages.
    """

    placement: str
    layouts_known: bool = False
    one_request_per_worker: bool = False
    path: str | None = None
    origin: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Resolution:
    """The outcome of resolving a transport for one endpoint."""

    kind: str
    options: Mapping[str, Any]
    reason: str

    @property
    def config(self) -> TransportConfig:
        return TransportConfig(self.kind, dict(self.options))


Resolver = Callable[[TransportConfig, TransportContext], Resolution]
_RESOLVERS: dict[str, Resolver] = {}


def register_transport_resolver(domain: str, resolver: Resolver, *, replace: bool = False) -> None:
    """Register the resolver of one domain (``inference``, ``replay``...).

    Raises:
        ValueError: a resolver is already registered for ``domain`` and ``replace`` is false.
    """
    if domain in _RESOLVERS and not replace and _RESOLVERS[domain] is not resolver:
        raise ValueError(f"a transport resolver is already registered for domain {domain!r}")
    _RESOLVERS[domain] = resolver


def registered_domains() -> tuple[str, ...]:
    return tuple(sorted(_RESOLVERS))


def resolve_transport(domain: str, requested: "str | TransportConfig | None", context: TransportContext) -> Resolution:
    """Resolve ``requested`` for ``domain`` in ``context``.

    Raises:
        ConfigurationError: no resolver for ``domain``, or the domain's resolver rejected the choice.
    """
    try:
        resolver = _RESOLVERS[domain]
    except KeyError:
        raise ConfigurationError(
            f"no transport resolver is registered for domain {domain!r}", alternatives=registered_domains()
        ) from None
    return resolver(as_transport_config(requested), context)
