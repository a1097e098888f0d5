"""``distributed``: the target runs as a torch.distributed worker rank that the launcher starts.

Local ranks are child processes (from the same preloaded forkserver as ``process``), each started with the
torch.distributed environment (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``) of its place
among its owner's hosts; everything the rank reaches of the other services goes through their clients, which
for ranks are ``distributed`` (gloo) or ``ray`` clients: the compatibility table and the plan's reachability
check insist on it. The launcher keeps a control pipe to each local rank, so a rank that dies is reported like
any peer failure (naming the rank and its exit code), and stops it within one deadline.

Ranks on other machines (``torchrun`` / ``srun`` setting the same variables) are not launched from here yet.
"""

from __future__ import annotations

import functools
import os
from typing import Any, Callable

from .process import ProcessHost


def _as_rank(factory: Callable[[], Any], rank: int, world_size: int) -> Any:
    """In the child: set the rank's torch.distributed environment, then build the target."""
    os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world_size),
                       "LOCAL_WORLD_SIZE": str(world_size), "GROUP_RANK": "0"})
    return factory()


class DistributedHost(ProcessHost):
    """Builds and serves the target in a local worker rank (a child process with its rank's environment).

    The rank is the host's position among its owner's hosts (``index``: ``(rank, world size)``).
    """

    placement = "distributed"
    shares_memory = False  # ranks may run on other nodes (torchrun, srun)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.rank, self.world_size = self.index
        self.factory = functools.partial(_as_rank, self.factory, self.rank, self.world_size)
        self.name = f"{self.name}-rank{self.rank}"
