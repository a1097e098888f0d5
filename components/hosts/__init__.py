"""Hosts: one module per placement, all behind :class:`~components.hosts.base.Host`.

A new placement is one new module here plus one line in :data:`HOSTS` and its rows in the components'
declarations (see :mod:`components.compat`). Host modules import their backend (threads, multiprocessing,
Ray) only when they are used.
"""

from __future__ import annotations

import importlib

from transports.errors import NotImplementedYetError

from .base import Done, Host, Pending, Resources, stop_all

HOSTS: dict[str, str] = {
    "direct": "components.hosts.direct:DirectHost",
    "thread": "components.hosts.thread:ThreadHost",
    "process": "components.hosts.process:ProcessHost",
    "ray": "components.hosts.ray:RayHost",
    "distributed": "components.hosts.distributed:DistributedHost",
    "submitit": "components.hosts.submitit:SubmititHost",
    "rpc": "components.hosts.rpc:RpcHost",
    "monarch": "components.hosts.monarch:MonarchHost",
}
"""placement -> ``module:class`` of its host (imported on first use)."""


def host_class(placement: str) -> type[Host]:
    """The host class of ``placement``.

    Raises:
        NotImplementedYetError: no host is built for that placement yet.
    """
    try:
        module, name = HOSTS[placement].split(":")
    except KeyError:
        raise NotImplementedYetError(f"no host is built for placement {placement!r} yet",
                                     alternatives=tuple(HOSTS)) from None
    return getattr(importlib.import_module(module), name)


__all__ = ["Done", "HOSTS", "Host", "Pending", "Resources", "host_class", "stop_all"]
