"""Hosts: one module per placement, all behind `Host`.

Each host module declares its placement next to its host class (``PLACEMENT = register(Placement(...))``, see
`transports.kernel.placements`): its name, aliases and reach. A new placement is its module, imported here (or
by a module of yours before the plan is made), plus its cells in the components' declarations (see
`components.compat`). Host modules import their backend (threads, multiprocessing, Ray, Monarch) only when
they are used.
"""

from __future__ import annotations

import importlib
from typing import Iterator, Mapping

from transports.kernel.errors import NotImplementedYetError
from transports.kernel.placements import placements

from .base import Done, Host, Pending, Resources, shutdown_all

BUILT_IN: tuple[str, ...] = ("direct", "thread", "process", "ray", "distributed", "submitit", "rpc", "monarch")
"""The host modules of this package: importing each registers its placement, in this order (the tables')."""
for _module in BUILT_IN:
    importlib.import_module(f"{__name__}.{_module}")


class _Hosts(Mapping):
    """placement -> its host class, read from the placement registry on every lookup."""

    def __getitem__(self, placement: str) -> type[Host]:
        for p in placements():
            if p.name == placement:
                return p.host
        raise KeyError(placement)

    def __iter__(self) -> Iterator[str]:
        return (p.name for p in placements())

    def __len__(self) -> int:
        return len(placements())


HOSTS: Mapping[str, type[Host]] = _Hosts()
"""placement -> its host class, for every registered placement."""


def host_class(placement: str) -> type[Host]:
    """The host class of ``placement``.

    Raises:
        NotImplementedYetError: no host is registered for that placement.
    """
    try:
        return HOSTS[placement]
    except KeyError:
        raise NotImplementedYetError(f"no host is built for placement {placement!r} yet",
                                     alternatives=tuple(HOSTS)) from None


__all__ = ["Done", "HOSTS", "Host", "Pending", "Resources", "host_class", "shutdown_all"]
