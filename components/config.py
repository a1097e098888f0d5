"""The config object an owner is built from: ``components.<name>`` in YAML, what its constructor takes, and what the
plan's resolution holds (`components.resolution.Resolved.config`).

Each component has one dataclass: `ComponentConfig`'s fields (where the owner lives, how clients reach it,
what its host may use) and the component's own options, each with one default and the range it declares
(`bounded`, `one_of`); ``rules()`` says what must
hold between fields. Plain data that imports nothing heavy: ``launcher/schema.py`` registers these classes as the YAML
schema, the preflight checks a composed config against their ranges, and constructing one from Python checks the
same.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar, Dict, Optional

from transports.kernel.errors import ConfigurationError
from transports.kernel.options import bounded, check_instance, check_value, device_option, fields_of, is_device, one_of

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
        """Every field within its declared range, then `rules`.

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


__all__ = ["CONNECTION_FIELDS", "ComponentConfig", "Resources", "bounded",
           "device_option", "one_of"]


_DEVICE = device_option("cpu")


def device_options(config: Any, path: str) -> list[tuple[str, str]]:
    """Every device a config object names, as ``(config path, device)``: its fields declared with
    `device_option` (``recipe.device``, ``components.inference.policy_device``...),
    unset ones left out.

    Args:
        config: a config dataclass instance.
        path: its config path (``recipe``, ``components.inference``).
    """
    return [(f"{path}.{name}", getattr(config, name)) for name, f in fields_of(type(config)).items()
            if is_device(f) and getattr(config, name) is not None]


def check_devices(config: Any, path: str) -> None:
    """Refuse a device that this machine does not have, of every device option of ``config`` (see
    `device_options`, `check_device`)."""
    for full, name in device_options(config, path):
        check_device(name, full)


def check_device(name: str, path: str) -> None:
    """Refuse a device this machine does not have (imports torch). Whether ``name`` is a device at all is the option's
    own range (`device_option`), checked when a config is composed or made; this is
    checked where the device is used: on the machine that runs a plan (``launcher.checks.check_here``, skipped by a dry
    run, which may plan for another node) and where an owner builds what runs on it.

    Raises:
        ConfigurationError: naming ``path``, the value and the devices there are.
    """
    import torch

    check_value(_DEVICE, name, path)  # a name at all (a config made in Python may not have been checked)
    if not name.startswith("cuda"):
        return
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    index = int(name.partition(":")[2] or 0)
    if index < count:
        return
    there = {0: "it has no CUDA device", 1: "it has one CUDA device (cuda:0)"}.get(
        count, f"it has {count} CUDA devices (cuda:0 to cuda:{count - 1})")
    raise ConfigurationError(f"{path} must be a device this machine has, got {name!r}: {there}; use cpu, or run where "
                             "the device is (a dry run plans for any node)", path=path)
