"""The data of transport selection: what a choice may know about the topology (`TransportContext`) and
its outcome (`Resolution`: the concrete kind and why).

There is deliberately no cross-domain transport interface for *payloads*: inference, replay, logging and
weight sync move different things. What is shared is the selection step, which the compatibility table
(`components.compat.resolve`) carries out with these values: ``auto`` is resolved deterministically, and
its reason is part of the answer so plans can show it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from .config import TransportConfig


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
        """The resolved transport as a value (its kind and options)."""
        return TransportConfig(self.kind, dict(self.options))
