"""The session settings of the placements that have them: ``ray:``, ``submitit:``, ``distributed:`` and ``rpc:`` in
YAML, each node named after its placement.

Each host module declares its settings dataclass once, beside the host that reads it; that class is also the YAML
schema of its node (``launcher/schema.py`` builds the top-level config from `settings_classes`), so every
field has one default and one declared range. A placement with settings adds one line to `SETTINGS`.
Plain data: the modules named here import nothing heavy at module level.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Mapping

SETTINGS: dict[str, str] = {
    "ray": "components.hosts.ray_cluster:RayClusterConfig",
    "submitit": "components.hosts.submitit:SubmititSettings",
    "distributed": "components.hosts.distributed:DistributedSettings",
    "rpc": "components.hosts.rpc:RpcSettings",
}
"""placement (and YAML node) -> ``module:class`` of its session settings."""


def settings_class(placement: str) -> type | None:
    """The settings dataclass of ``placement`` (``None``: the placement has no session settings).

    Args:
        placement: a placement name (``ray``, ``submitit``...).
    """
    if placement not in SETTINGS:
        return None
    module, name = SETTINGS[placement].split(":")
    return getattr(importlib.import_module(module), name)


def settings_classes() -> dict[str, type]:
    """Every placement's settings dataclass, in `SETTINGS` order."""
    return {placement: settings_class(placement) for placement in SETTINGS}


def settings_of(kind: type, node: Mapping[str, Any] | None) -> Any:
    """An instance of settings dataclass ``kind`` from a YAML node (or a plain mapping): unset (``None``) values
    take the field's default, unknown keys and values out of range raise.

    Args:
        kind: the settings dataclass.
        node: its values (``plan.sessions[placement]``), or ``None`` for the defaults.

    Raises:
        TypeError: a key that is no field of ``kind``.
        ConfigurationError: a value outside the range its field declares.
    """
    names = {f.name for f in dataclasses.fields(kind)}
    values = {k: v for k, v in dict(node or {}).items() if v is not None}
    unknown = sorted(set(values) - names)
    if unknown:
        raise TypeError(f"{kind.__name__} has no field {unknown[0]!r}")
    return kind(**values)
