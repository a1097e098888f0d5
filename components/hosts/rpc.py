"""``rpc``: collector workers driven through ``torch.distributed.rpc``.

Each worker is a child process of this machine, started like a ``process`` child (from the preloaded forkserver,
watched the same way, stopped within the same deadline), that joins one static rpc world with the driver: the
driver is rank 0 and worker ``w`` of ``n`` is rank ``w + 1`` of ``n + 1``. Control calls (a collector's ``collect``)
travel as rpc calls, answered in the order they were sent; the rollouts they produce are handed over as a ``process``
child's are (shared memory by index), so rpc carries commands and small answers only.

The world stays on this machine: its rendezvous is a ``file://`` store in a private temporary directory, and the
rpc agents (TensorPipe) and their gloo group listen on the loopback interface only (``rpc.interface``, default
``lo``; ``TP_SOCKET_IFNAME`` and ``GLOO_SOCKET_IFNAME`` are set from it). A process belongs to one rpc world at
a time, so one collector's workers use this placement at a time, and a worker that dies cannot rejoin the world:
``resources.max_restarts`` must stay 0 (refused when the plan is made). A killed worker is a peer failure naming it,
at once (its rpc connection closes and its process's sentinel fires).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import os
import pickle
import shutil
import socket
import tempfile
import threading
import time
from typing import Any, ClassVar, Iterator, Mapping

from transports.kernel.errors import ConfigurationError, PeerFailureError, ServiceTimeoutError
from transports.kernel.options import bounded, check_instance
from transports.kernel.placements import Placement, Reach, register

from ._rpc_worker import LEAVE_S, as_rpc_worker, backend_options, leave_world, on_interface, run_call
from .base import Pending, Resources, RunSetting, exit_description
from .process import ProcessHost
from .settings import settings_of


@dataclasses.dataclass
class RpcSettings:
    """``rpc.*`` in YAML: the ``rpc`` placement's world (collector workers driven through torch.distributed.rpc).

    Attributes:
        interface: the network interface rpc agents listen on (``lo``: this machine only).
        threads: rpc worker threads per process (calls in flight at once).
    """

    interface: str = "lo"
    threads: int = bounded(4, ge=2)

    def __post_init__(self):
        check_instance(self, path="rpc")

    def check_here(self) -> None:
        """Refuse an ``interface`` this machine does not have (checked where the world is made, not while planning).

        Raises:
            ConfigurationError: naming ``rpc.interface`` and the machine's interfaces.
        """
        interfaces = sorted(name for _, name in socket.if_nameindex())
        if self.interface not in interfaces:
            raise ConfigurationError(f"rpc.interface={self.interface!r} is no network interface of this machine",
                                     path="rpc.interface", alternatives=tuple(interfaces))


_settings = RunSetting(RpcSettings())
_WORLDS = itertools.count()


class _World:
    """One static rpc world: the driver (rank 0, joining on a thread of its own) and ``size - 1`` workers."""

    current: ClassVar["_World | None"] = None
    lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, size: int, settings: RpcSettings, timeout: float):
        from torch.distributed import rpc

        self.size, self.settings, self.timeout = size, settings, timeout
        self.dir = tempfile.mkdtemp(prefix="rlsvc-rpc-")
        self.init_method = f"file://{self.dir}/store"
        # torch prefixes each rendezvous of a process with a count of its earlier ones: fresh workers must use the
        # driver's count for this one (a driver that ran worlds before has counted them)
        self.counter = rpc._init_counter
        # and names this process never used in a world before: torch numbers its all-gathers by the set of names
        self.driver = f"driver-{os.getpid()}-{next(_WORLDS)}"
        self.members: set[int] = set()
        self.stopping: set[int] = set()
        self.broken = False  # a worker failed: ranks leave alone, none waits for the others
        self.closed = False  # every worker left
        self.ending: threading.Thread | None = None
        self.joined = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._join, name="rpc-driver-join", daemon=True)
        self.thread.start()

    def _join(self) -> None:
        from torch.distributed import rpc

        try:
            with on_interface(self.settings.interface):
                rpc.init_rpc(self.driver, rank=0, world_size=self.size,
                             rpc_backend_options=backend_options(self.init_method, self.settings.threads, self.timeout))
        except BaseException as exc:  # noqa: BLE001 - raised by the hosts that wait for it
            self.error = exc
        self.joined.set()

    @classmethod
    def enter(cls, host: "RpcHost") -> "_World":
        position, count = host.index
        with cls.lock:
            world = cls.current
            if world is not None and world.closed:
                if world.thread.is_alive():
                    raise ConfigurationError(f"{host.name}: the previous rpc world's driver is still joining it (its "
                                             f"rendezvous gives up within {world.timeout:g} s): start again then",
                                             path="components.collector.placement")
                world = cls.current = None
            if world is None:
                from torch.distributed import rpc

                if rpc.api._is_current_rpc_agent_set():
                    raise ConfigurationError(f"{host.name}: this process is in an rpc world already (torch allows "
                                             "one per process): shut it down, or place the collector elsewhere",
                                             path="components.collector.placement")
                world = cls.current = cls(count + 1, _settings.value, host.resources.startup_timeout)
            if world.size != count + 1 or position + 1 in world.members:
                raise ConfigurationError(f"{host.name}: one collector's workers use the rpc placement at a time (a "
                                         f"world of {world.size - 1} workers runs; worker {position} of {count} "
                                         "cannot join it)", path="components.collector.placement")
            world.members.add(position + 1)
        return world

    def stop_requested(self, rank: int, serving: bool) -> None:
        """Worker ``rank`` was asked to stop (``serving``: it was running its target); once every worker was, and
        all of them were serving, the driver leaves with them (on a thread: the hosts meanwhile wait for their
        processes to end). Otherwise it leaves alone when the last host stopped."""
        with self.lock:
            self.stopping.add(rank)
            self.broken = self.broken or not serving
            if (self.ending is not None or self.broken or not self.stopping >= self.members or not self.joined.is_set()
                    or self.error):
                return
            self.ending = threading.Thread(target=leave_world, name="rpc-driver-leave", daemon=True)
        self.ending.start()

    def leave(self, rank: int) -> None:
        """Worker ``rank`` stopped; the last one out ends the world (the driver's agent, the store's directory)."""
        with self.lock:
            self.members.discard(rank)
            if self.members:
                return
            self.closed = True
        self.thread.join(1.0)  # a driver still joining gives up by itself (its rendezvous times out); until then
        # this world stays current, so no other forms beside it
        if not self.thread.is_alive():
            with self.lock:
                if _World.current is self:
                    _World.current = None
        if self.ending is not None:
            self.ending.join(LEAVE_S + 5.0)
        elif self.joined.is_set() and self.error is None:
            leave_world(together=False)
        shutil.rmtree(self.dir, ignore_errors=True)

    def wait(self, deadline: float, host: "RpcHost") -> None:
        while not self.joined.wait(0.05):
            if not host._runs():
                raise PeerFailureError(f"{host._lost()} before the rpc world formed")
            if time.monotonic() >= deadline:
                raise ServiceTimeoutError(f"{host.name}: the rpc world of {self.size} ranks did not form within "
                                          f"{self.timeout:g} s (a worker did not join)")
        if self.error is not None:
            raise PeerFailureError(f"{host.name}: the driver could not join the rpc world: {self.error}")


class _Answer(Pending):
    """The answer to one rpc control call: its future, or the worker's death."""

    __slots__ = ("host", "method", "future", "done")

    def __init__(self, host: "RpcHost", method: str, future):
        self.host, self.method, self.future = host, method, future
        self.done = threading.Event()
        future.add_done_callback(lambda _: self.done.set())

    def ready(self, timeout: float) -> bool:
        return self.done.wait(timeout) or not self.host._runs()

    def result(self, timeout: float | None = None) -> Any:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.done.wait(0.1 if deadline is None else max(0.0, min(0.1, deadline - time.monotonic()))):
            if not self.host._runs():
                raise PeerFailureError(f"{self.host._lost()} during {self.method!r}")
            if deadline is not None and time.monotonic() >= deadline:
                raise ServiceTimeoutError(f"{self.host.name}: {self.method!r} not answered within {timeout} s")
        try:
            kind, value = self.future.wait()
        except Exception as exc:  # noqa: BLE001 - torch raises RuntimeError for a closed connection
            self.host._wait_ended(2.0)  # the connection closes as the process dies: its exit status follows
            raise PeerFailureError(f"{self.host._lost()} during {self.method!r} ({str(exc).splitlines()[0]})") from None
        if kind == "error":
            raise value
        return value


class RpcHost(ProcessHost):
    """A ``process`` child whose control calls travel through ``torch.distributed.rpc``.

    Worker ``index[0]`` of ``index[1]`` is rank ``index[0] + 1`` of the run's rpc world.
    """

    placement = "rpc"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.check_resources(self.resources)
        self.rank = self.index[0] + 1
        self.name = f"{self.name}-rpc{self.rank}"
        self._world: _World | None = None
        self._serving = False
        self._calls = 0
        self._calls_lock = threading.Lock()

    @classmethod
    def check_resources(cls, resources: Resources) -> None:
        super().check_resources(resources)
        if resources.max_restarts:
            raise ConfigurationError("resources.max_restarts must be 0 on the rpc placement: its workers form a "
                                     "fixed rpc world that a restarted worker cannot rejoin (use process placement "
                                     "for restarts)", path="resources.max_restarts")

    @classmethod
    def check_session(cls, settings: Mapping[str, Any], placed: Mapping[str, Resources]) -> None:
        settings_of(RpcSettings, settings).check_here()

    @classmethod
    @contextlib.contextmanager
    def session(cls, settings: Mapping[str, Any], *, run_dir: str | None = None) -> Iterator[None]:
        """The run's ``rpc.*``."""
        run = settings_of(RpcSettings, settings)
        run.check_here()
        with _settings.holding(run):
            yield

    def _launch(self) -> None:
        self._world = world = _World.enter(self)
        self.factory = functools.partial(as_rpc_worker, self.factory, self.name, self.rank, world.size,
                                         world.init_method, world.counter, world.settings, world.timeout)
        try:
            super()._launch()
        except BaseException:
            self._leave()
            raise

    def wait_ready(self) -> None:
        deadline = time.monotonic() + self.resources.startup_timeout
        super().wait_ready()  # the worker joined the world and built its target
        try:
            self._world.wait(deadline, self)
        except BaseException:
            self.shutdown(1.0)
            raise
        self._serving = True

    def submit(self, method: str, *args: Any) -> Pending:
        from torch.distributed import rpc

        if not self.is_alive:
            raise PeerFailureError(self.death or f"{self.name} is not running")
        with self._calls_lock:  # numbered as sent: the worker runs them in this order, so a number not sent is reused
            try:
                future = rpc.rpc_async(self.name, run_call, args=(self._calls, method, args), timeout=0)
            except (pickle.PicklingError, TypeError, AttributeError):  # arguments that cannot travel: nothing was sent
                raise
            except Exception as exc:  # noqa: BLE001 - the worker's connection closed
                raise PeerFailureError(f"{self._lost()} before {method!r} ({str(exc).splitlines()[0]})") from None
            self._calls += 1
        return _Answer(self, method, future)

    def begin_shutdown(self) -> None:
        if self._process is None or self._stopping:
            return  # asked already (stop() asks again)
        serving = self._serving and self._runs() and self.death is None
        super().begin_shutdown()
        if self._world is not None:
            self._world.stop_requested(self.rank, serving)

    def shutdown(self, timeout: float | None = None) -> None:
        if self._process is None:
            return
        try:
            super().shutdown(timeout)
        finally:
            self._leave()

    def _leave(self) -> None:
        if self._world is not None:
            world, self._world = self._world, None
            world.leave(self.rank)

    def _lost(self) -> str:
        if self._process is None:
            return f"the {self.name} rpc worker (rank {self.rank}) was stopped"
        return f"the {self.name} rpc worker (rank {self.rank}) died ({exit_description(self._exitcode())})"


# rpc workers reach services as the workers of any rpc world would: over network transports
PLACEMENT = register(Placement("rpc", RpcHost, Reach.NETWORK,
                                summary="collectors only: workers of a torch.distributed.rpc world"))
