"""``TransportConfig``: a transport choice as a value (kind plus options), frozen and hashable."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

from .kernel.errors import ConfigurationError
from .kinds import normalize_transport_kind


@dataclass(frozen=True)
class TransportConfig:
    """A transport kind and its options.

    Args:
        kind: ``auto`` or a registered transport kind (`transports.kinds.transport_kinds`; aliases accepted).
        options: keyword options for the concrete transport (``num_slots``, ``backend``...).

    Examples:
        >>> TransportConfig("shm", {"num_slots": 8})
        TransportConfig(kind='shared_memory', options={'num_slots': 8})
    """

    kind: str = "auto"
    options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        object.__setattr__(self, "kind", normalize_transport_kind(self.kind))
        if not isinstance(self.options, Mapping):
            raise ConfigurationError(f"transport options must be a mapping, got {self.options!r}")
        object.__setattr__(self, "options", MappingProxyType(dict(self.options)))

    def __hash__(self):
        return hash((self.kind, tuple(sorted(self.options.items(), key=lambda kv: kv[0]))))

    def __repr__(self):
        return f"TransportConfig(kind={self.kind!r}, options={dict(self.options)!r})"

    def __reduce__(self):
        return (TransportConfig, (self.kind, dict(self.options)))


def as_transport_config(value: "str | TransportConfig | None", options: Mapping[str, Any] | None = None) -> TransportConfig:
    """Coerce ``None`` (auto), a kind name or a `TransportConfig` into a `TransportConfig`."""
    if isinstance(value, TransportConfig):
        if options:
            return TransportConfig(value.kind, {**value.options, **options})
        return value
    return TransportConfig(normalize_transport_kind(value), dict(options or {}))
