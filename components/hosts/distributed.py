"""``distributed``: the target runs as a torch.distributed worker rank.

``distributed.ranks=local`` (the default): the launcher starts the ranks itself, as child processes (from the same
preloaded forkserver as ``process``), each with the torch.distributed environment (``RANK``, ``LOCAL_RANK``,
``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``) of its place among its owner's hosts. The launcher keeps a control pipe to each,
so a rank that dies is reported like any peer failure (naming the rank and its exit code).

``distributed.ranks=env``: ``torchrun`` or ``srun`` started the ranks, on one machine or several, each running the same
``python -m launcher ...`` with those variables set. Rank 0 is the driver; rank ``r >= 1`` becomes the host of
worker ``r - 1`` (so ``WORLD_SIZE`` is the worker count plus one): it dials the driver at ``distributed.host``
(default ``MASTER_ADDR``), port ``distributed.port + r - 1`` (default port ``MASTER_PORT + 1``), and both prove they
hold the key in the ``RLSVC_KEY`` environment variable, which must be the same secret on every rank (nothing either side
receives is unpickled before that; see `components.hosts.connected`). The driver then sends the worker's target; the
rank serves it as a ``process`` child does, until the driver stops it. A rank whose connection closes is a peer failure
naming it.

Everything a rank reaches of the other services goes through their clients, which for ranks are ``distributed``
(gloo) or ``ray`` clients: the compatibility table and the plan's reachability check insist on it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import pickle
import socket
import sys
import time
from multiprocessing.connection import Client
from typing import Any, Callable, Iterator, Mapping, Optional

from transports.kernel.errors import ConfigurationError, PeerFailureError, ServiceTimeoutError
from transports.kernel.options import bounded, check_instance
from transports.kernel.placements import Placement, Reach, register
from transports.kernel.secret import shared_key

from .base import Resources, RunSetting
from .connected import ConnectedHost, keep_alive
from .child import child_main
from .process import ProcessHost
from .settings import settings_of as settings_from

log = logging.getLogger(__name__)

RANKS = ("local", "env")


@dataclasses.dataclass
class DistributedSettings:
    """``distributed.*`` in YAML: who starts the ranks of the ``distributed`` placement (collector workers).

    Attributes:
        ranks: ``local``: the launcher spawns them, as child processes | ``env``: torchrun/srun did; rank 0 drives,
            rank ``r`` is worker ``r - 1``.
        host: ``env``: the address ranks dial the driver at (``None``: ``MASTER_ADDR``).
        port: ``env``: rank ``r`` dials ``port + r - 1`` (``None``: ``MASTER_PORT + 1``).
        connect_timeout: ``env``: seconds the driver waits for each rank to connect.
    """

    ranks: str = "local"
    host: Optional[str] = None
    port: Optional[int] = bounded(None, ge=1, le=65535)
    connect_timeout: float = bounded(120.0, gt=0, unit="seconds")

    def __post_init__(self):
        check_instance(self, path="distributed")
        if self.ranks not in RANKS:
            raise ConfigurationError(f"distributed.ranks must be one of {', '.join(RANKS)}, got {self.ranks!r}",
                                     path="distributed.ranks", alternatives=RANKS)

    def address(self, rank: int) -> tuple[str, int]:
        """Where rank ``rank`` (``>= 1``) dials the driver.

        Raises:
            ConfigurationError: neither ``distributed.host`` / ``port`` nor ``MASTER_ADDR`` / ``MASTER_PORT`` say.
        """
        host = self.host or os.environ.get("MASTER_ADDR")
        port = self.port if self.port is not None else _int_env("MASTER_PORT", 1)
        if not host or port is None:
            raise ConfigurationError("distributed.ranks=env: set distributed.host and distributed.port (or run under "
                                     "torchrun, which sets MASTER_ADDR and MASTER_PORT)", path="distributed.host")
        return host, port + rank - 1


def _int_env(name: str, plus: int = 0) -> int | None:
    value = os.environ.get(name)
    return None if value is None else int(value) + plus


def rank_key() -> bytes:
    """The secret every rank of the run shares (``RLSVC_KEY``), as the challenge's key.

    Raises:
        ConfigurationError: the variable is not set (or empty).
    """
    return shared_key("distributed.ranks=env", "distributed.ranks")


def settings_of(node: Mapping[str, Any] | None) -> DistributedSettings:
    """The run's ``distributed.*`` from its YAML node (unset values: the defaults)."""
    return settings_from(DistributedSettings, node)


_current = RunSetting(DistributedSettings())


def _as_rank(factory: Callable[[], Any], rank: int, world_size: int) -> Any:
    """In the child: set the rank's torch.distributed environment, then build the target."""
    os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world_size),
                       "LOCAL_WORLD_SIZE": str(world_size), "GROUP_RANK": "0"})
    return factory()


class DistributedHost(ProcessHost):
    """Builds and serves the target in a worker rank: a local child process with its rank's environment, or (with
    ``distributed.ranks=env``) a rank ``torchrun`` / ``srun`` started, as `EnvRankHost`.

    The rank is the host's position among its owner's hosts (``index``: ``(rank, world size)``).
    """

    placement = "distributed"
    shares_memory = False  # ranks may run on other nodes (torchrun, srun)
    may_share_memory = True  # a rank on the driver's machine hands rollouts over through shared memory

    def __new__(cls, *args, **kwargs):
        if cls is DistributedHost and _current.value.ranks == "env":
            cls = EnvRankHost
        return super().__new__(cls)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.rank, self.world_size = self.index
        self.factory = functools.partial(_as_rank, self.factory, self.rank, self.world_size)
        self.name = f"{self.name}-rank{self.rank}"

    @classmethod
    @contextlib.contextmanager
    def session(cls, settings: Mapping[str, Any], *, run_dir: str | None = None) -> Iterator[None]:
        """The run's ``distributed.*``; with ``ranks=env``, checks the key and the address before any owner starts."""
        new = settings_of(settings)
        if new.ranks == "env":
            rank_key()
            new.address(1)
        with _current.holding(new):
            yield

    @classmethod
    def check_session(cls, settings: Mapping[str, Any], placed: Mapping[str, Resources]) -> None:
        """With ``ranks=env``, a driver that ``torchrun`` (or ``srun``) started: else it would wait for ranks that
        nobody starts."""
        if settings_of(settings).ranks == "env" and _int_env("WORLD_SIZE") is None and placed:
            workers = next(iter(placed))  # the collector
            raise ConfigurationError(f"distributed.ranks=env takes its ranks from torchrun or srun, but WORLD_SIZE is "
                                     f"not set here: start the {workers}'s ranks and the driver with torchrun -m "
                                     "launcher ... (under srun, set RANK and WORLD_SIZE), or set distributed.ranks=local "
                                     "for ranks the launcher starts", path="distributed.ranks")

    @classmethod
    def on_run_machine(cls, settings: Mapping[str, Any]) -> bool:
        return settings_of(settings).ranks == "local"


PLACEMENT = register(Placement("distributed", DistributedHost, Reach.NETWORK,
                                summary="a torch.distributed worker rank of the run's world"))


class EnvRankHost(ConnectedHost, DistributedHost):
    """A worker rank that ``torchrun`` / ``srun`` started: rank ``index[0] + 1`` dials this host, proves it holds the
    run's key, and is sent its target."""

    def __init__(self, *args, **kwargs):
        ConnectedHost.__init__(self, *args, **kwargs)  # not DistributedHost's: the rank has its environment already
        self.rank, self.world_size = self.index[0] + 1, self.index[1] + 1
        _check_world_size(self.index[1])
        self.name = f"{self.name}-rank{self.rank}"
        self._settings = _current.value
        self._key = rank_key()

    def _launch(self) -> None:
        host, port = self._settings.address(self.rank)
        try:
            self._server = socket.create_server((host, port))
        except OSError as exc:
            raise PeerFailureError(f"{self.name}: cannot listen on {host}:{port} for rank {self.rank} ({exc}); set "
                                   "distributed.port to a free range of ports") from None

    def wait_ready(self) -> None:
        timeout = self._settings.connect_timeout
        self._connect(time.monotonic() + timeout, lambda: f"rank {self.rank} did not connect within {timeout:g} s "
                      "(distributed.connect_timeout; WORLD_SIZE must be the number of collectors + 1)",
                      send=pickle.dumps(self.factory, protocol=pickle.HIGHEST_PROTOCOL))

    def _lost(self, when: str = "") -> str:
        return f"{self.name}: rank {self.rank} closed its connection (it ended, or its node was lost){when}"

    def _force_stop(self, budget: float) -> None:
        self._stopping = True  # not a process of this machine: it ends once it sees its connection close


def check_world(plan: Any) -> None:
    """With ``distributed.ranks=env``, before anything starts: only collector workers run as ranks, one rank each
    besides the driver (``WORLD_SIZE``, where set).

    Raises:
        ConfigurationError: another component placed on ``distributed``; ``WORLD_SIZE`` not the workers + 1.
    """
    on_ranks = [c for c in plan.components if issubclass(c.host, DistributedHost)]
    for c in on_ranks:
        if c.name != "collector":
            raise ConfigurationError(f"distributed.ranks=env runs collector workers as the ranks torchrun/srun started; "
                                     f"{c.name} cannot take one: place it elsewhere", path=f"components.{c.name}.placement")
    workers = int(on_ranks[0].options.get("num_collectors", 1)) if on_ranks else 0
    _check_world_size(workers)


def _check_world_size(workers: int) -> None:
    world = _int_env("WORLD_SIZE")
    if world is not None and world != workers + 1:
        raise ConfigurationError(f"distributed.ranks=env: WORLD_SIZE={world}, but rank 0 drives and each of the "
                                 f"{workers} collector workers is a rank: start {workers + 1} ranks, or set "
                                 f"components.collector.num_collectors={world - 1}",
                                 path="components.collector.num_collectors")


# ---------------------------------------------------------------------------------------------- the rank's side
def rank_of_environment(node: Mapping[str, Any] | None, *, driver: bool = False) -> int | None:
    """With ``distributed.ranks=env``: this process's rank when it is a worker rank started by ``torchrun`` / ``srun``
    (``RANK >= 1``), or with ``driver`` when it is the driver (``RANK`` 0 or unset); else ``None``."""
    if settings_of(node).ranks != "env":
        return None
    rank = _int_env("RANK") or 0
    return rank if (rank == 0) == driver else None


def serve_rank(node: Mapping[str, Any] | None, rank: int) -> None:
    """On rank ``rank``: dial the driver (retrying while it is not listening yet, up to ``connect_timeout``), prove
    the key both ways, receive the target, and serve it as a ``process`` child does until the driver stops it. Leaves
    the process with ``os._exit`` (status 0, or 1 when the target failed to build), as a job of ``submitit`` does."""
    settings = settings_of(node)
    address, key = settings.address(rank), rank_key()
    deadline = time.monotonic() + settings.connect_timeout
    while True:
        try:
            conn = Client(address, family="AF_INET", authkey=key)
            keep_alive(conn.fileno())  # a driver whose node or link is lost ends this rank too
            break
        except (ConnectionRefusedError, socket.gaierror):
            if time.monotonic() >= deadline:
                raise ServiceTimeoutError(f"rank {rank}: the driver at {address[0]}:{address[1]} did not listen "
                                          f"within {settings.connect_timeout:g} s (distributed.connect_timeout)") from None
            time.sleep(0.5)
    log.info("rank %d: connected to the driver at %s:%d", rank, *address)
    factory = pickle.loads(conn.recv_bytes())  # from the driver, which proved it holds the key
    served = child_main(factory, conn, own_signals=False)
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(0 if served else 1)
