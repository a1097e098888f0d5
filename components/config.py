"""The config object an owner is built from: ``components.<name>`` in YAML, what its constructor takes, and what the
plan's resolution holds (:attr:`components.resolution.Resolved.config`).

Each component has one dataclass: :class:`ComponentConfig`'s fields (where the owner lives, how clients reach it,
what its host may use) and the component's own options, each with one default and the range it declares
(:func:`~transports.options.bounded`, :func:`~transports.options.one_of`); ``rules()`` says what must hold between
fields. Plain data that imports nothing heavy: ``launcher/schema.py`` registers these classes as the YAML schema, the
preflight checks a composed config against their ranges, and constructing one from Python checks the same.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar, Dict, Optional

from transports.errors import ConfigurationError
from transports.options import bounded, check_instance, one_of

from .hosts.base import Resources

CONNECTION_FIELDS: tuple[str, ...] = ("placement", "transport", "transport_options", "resources")
"""The fields every component config has: where its owner lives and how clients reach it."""


@dataclass
class ComponentConfig:
    """Placement, transport and resources of one component; a component's own config adds its options.

    Attributes:
        placement: where the owner lives (``None``: ``service=``, a ``service_backend`` scope, else the component's
            default).
        transport: how clients reach it (``None``: ``transport=``, a ``transport_backend`` scope, else ``auto``).
        transport_options: keyword options of the transport (its descriptor's options dataclass).
        resources: what the owner's host may use.
    """

    component: ClassVar[str] = ""

    placement: Optional[str] = None  # direct | thread | process | ray | distributed | monarch (| submitit, rpc: collectors)
    transport: Optional[str] = None  # auto | direct | thread | queue | shared_memory | process_slot | ray | distributed | monarch
    transport_options: Dict[str, Any] = field(default_factory=dict)  # options of the chosen transport
    resources: Resources = field(default_factory=Resources)

    def __post_init__(self):
        if not isinstance(self.resources, Resources):
            self.resources = Resources.of(self.resources)
        self.check()

    @property
    def path(self) -> str:
        """The config path of this component's node (``components.<name>``)."""
        return f"components.{self.component}" if self.component else "components"

    def check(self) -> None:
        """Every field within its declared range, then :meth:`rules`.

        Raises:
            ConfigurationError: naming ``components.<name>.<field>``, the value and what is allowed.
        """
        check_instance(self, path=self.path)
        for name, holds, wrong in self.rules():
            if not holds:
                raise ConfigurationError(wrong, path=f"{self.path}.{name}")

    def rules(self) -> tuple[tuple[str, bool, str], ...]:
        """What must hold between fields, as ``(field to blame, holds, what is wrong)``."""
        return ()

    def options(self) -> dict[str, Any]:
        """The component's own options (every field but the connection fields)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in CONNECTION_FIELDS}

    def replace(self, **changes: Any) -> "ComponentConfig":
        """A copy with ``changes`` (checked again)."""
        return dataclasses.replace(self, **changes)


@dataclass
class LoggerConfig(ComponentConfig):
    """``components.logger``: where the logger lives (its backend and options are the ``logger`` group's)."""

    component: ClassVar[str] = "logger"


@dataclass
class WeightSyncConfig(ComponentConfig):
    """``components.weight_sync``: where the versions of the weights live and how receivers reach them."""

    component: ClassVar[str] = "weight_sync"


__all__ = ["CONNECTION_FIELDS", "ComponentConfig", "LoggerConfig", "Resources", "WeightSyncConfig", "bounded",
           "one_of"]


def check_device(name: str, path: str) -> None:
    """Refuse a torch device this machine does not have (imports torch: called while planning and where the device is
    used, never when a config is composed).

    Raises:
        ConfigurationError: naming ``path``, the value and what is allowed.
    """
    if not usable_device(name):
        raise ConfigurationError(f"{path} must be a device this machine has (cpu, or cuda[:N] with CUDA available), "
                                 f"got {name!r}", path=path)


def usable_device(name: str) -> bool:
    """Whether ``name`` is a torch device this machine has."""
    import torch

    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        return False
    if device.type == "cuda":
        return torch.cuda.is_available() and (device.index is None or device.index < torch.cuda.device_count())
    return device.type in ("cpu", "meta") or hasattr(torch, device.type)
