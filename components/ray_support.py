"""Ray placement: joining or starting a cluster on loopback, owners hosted in actors, and Ray errors turned
into ours.

Every ``ray`` owner is an actor built from a factory inside the actor; ``start()`` returns once the actor's
resource is built. Clients hold the actor handle (picklable, so they reach Ray workers and other drivers)
and send acknowledged calls; what they raise is our error hierarchy, never a raw Ray exception:

- an exception raised by the owner's method: :class:`RemoteError` with the remote type, message and
  traceback text (our own :class:`ServiceError` subclasses keep their type);
- the actor died (``kill -9``, node loss, an error while constructing it): :class:`PeerFailureError`;
- no answer within the caller's timeout: :class:`ServiceTimeoutError`.

Ray is imported lazily (it is the ``ray`` extra) and always after ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``
is set, which together with ``_node_ip_address="127.0.0.1"`` keeps a local cluster on loopback.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping

from transports.errors import (
    ConfigurationError,
    PeerFailureError,
    RemoteError,
    ServiceError,
    ServiceTimeoutError,
)

LOOPBACK = "127.0.0.1"
DEFAULT_NAMESPACE = "rl_services"


def import_ray():
    """``ray``, imported with the loopback setting in place; a clear error when the extra is missing."""
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    try:
        import ray
    except ImportError as exc:  # pragma: no cover - depends on the installation
        raise ConfigurationError(
            "placement 'ray' needs Ray: pip install 'rl-services-launcher[ray]'", path="service"
        ) from exc
    return ray


# ---------------------------------------------------------------------------------------------- cluster
@dataclass(frozen=True)
class RayClusterConfig:
    """Where Ray owners run: ``address`` joins a running cluster; ``None`` starts a local one on loopback.

    Args:
        address: ``host:port`` of a running cluster (``"auto"`` finds one started with ``ray start``).
        namespace: namespace of named actors (registries, named owners).
        num_cpus: CPUs a locally started cluster advertises (``None``: the machine's).
        resources: custom resources a locally started head node advertises.
        temp_dir: Ray's session directory for a locally started cluster (short paths only: Unix sockets
            live there).
    """

    address: str | None = None
    namespace: str = DEFAULT_NAMESPACE
    num_cpus: float | None = None
    resources: Mapping[str, float] = field(default_factory=dict)
    temp_dir: str | None = None


@contextlib.contextmanager
def ray_cluster(config: RayClusterConfig | None = None) -> Iterator[bool]:
    """Connect to Ray for the block: reuse a connection this process already has, join ``config.address``,
    or start a local cluster bound to 127.0.0.1. Yields whether this call started the cluster; only then is
    it stopped on exit. Call it on the main thread (a cluster started from another thread loses its
    control daemon when that thread ends)."""
    ray = import_ray()
    config = config or RayClusterConfig()
    if ray.is_initialized():
        yield False
        return
    if threading.current_thread() is not threading.main_thread():
        raise ConfigurationError("start or join the Ray cluster on the main thread", path="service")
    common = dict(namespace=config.namespace, log_to_driver=False, configure_logging=True, logging_level="WARNING")
    own_dir = None
    if config.address:
        ray.init(address=config.address, **common)
        started = False
    else:
        # a short session dir of its own (Ray's Unix sockets live there), removed with the cluster
        temp_dir = config.temp_dir or (own_dir := tempfile.mkdtemp(prefix="ray_", dir="/tmp"))
        ray.init(_node_ip_address=LOOPBACK, num_cpus=config.num_cpus, resources=dict(config.resources) or None,
                 include_dashboard=False, _temp_dir=temp_dir, **common)
        started = True
    try:
        yield started
    finally:
        # a joined cluster keeps running; only the connection ends
        ray.shutdown()
        if own_dir is not None:
            shutil.rmtree(own_dir, ignore_errors=True)


def namespace() -> str:
    """The namespace of the current Ray connection."""
    ray = import_ray()
    return ray.get_runtime_context().namespace if ray.is_initialized() else DEFAULT_NAMESPACE


def require_connection(what: str) -> Any:
    ray = import_ray()
    if not ray.is_initialized():
        raise ConfigurationError(
            f"{what} is placed on 'ray' but this process is not connected to a Ray cluster: run it under the "
            "launcher (service=ray) or inside components.ray_support.ray_cluster()",
            path="service",
        )
    return ray


# ---------------------------------------------------------------------------------------------- resources
@dataclass(frozen=True)
class ActorResources:
    """What one actor reserves and how it is supervised (``components.<name>.resources`` in YAML).

    ``num_cpus=None`` reserves no CPU (several owners then share a small machine; the OS schedules them);
    ``max_restarts`` restarts a crashed actor, and its interrupted calls are retried as many times;
    ``startup_timeout`` bounds scheduling plus construction (resources no node has never schedule).
    """

    num_cpus: float | None = None
    num_gpus: float = 0.0
    memory: int | None = None
    max_restarts: int = 0
    max_concurrency: int = 1
    custom: Mapping[str, float] = field(default_factory=dict)
    startup_timeout: float = 120.0

    @classmethod
    def from_config(cls, conf: Any) -> "ActorResources":
        if conf is None:
            return cls()
        get = conf.get if hasattr(conf, "get") else lambda k, d=None: getattr(conf, k, d)
        return cls(num_cpus=get("num_cpus"), num_gpus=float(get("num_gpus", 0.0) or 0.0), memory=get("memory"),
                   max_restarts=int(get("max_restarts", 0) or 0), max_concurrency=int(get("max_concurrency", 1) or 1),
                   custom=dict(get("custom", {}) or {}), startup_timeout=float(get("startup_timeout", 120.0) or 120.0))

    def options(self, *, max_concurrency: int | None = None) -> dict:
        opts: dict[str, Any] = {
            "num_cpus": 0 if self.num_cpus is None else self.num_cpus,
            "num_gpus": self.num_gpus,
            "max_restarts": self.max_restarts,
            "max_task_retries": self.max_restarts,
            "max_concurrency": max(self.max_concurrency, max_concurrency or 1),
        }
        if self.memory:
            opts["memory"] = int(self.memory)
        if self.custom:
            opts["resources"] = dict(self.custom)
        return opts


# ---------------------------------------------------------------------------------------------- errors
def translate(exc: BaseException, what: str) -> BaseException:
    """Our error for a Ray exception raised while waiting for ``what``."""
    import_ray()
    from ray import exceptions as rex

    if isinstance(exc, rex.RayTaskError):
        cause = getattr(exc, "cause", None)
        if isinstance(cause, ServiceError):
            return cause
        if isinstance(cause, BaseException):
            kind = type(cause)
            name = kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
            return RemoteError(name, str(cause), str(exc))
        return RemoteError("unknown", str(exc), str(exc))
    if isinstance(exc, rex.ActorDiedError) and "creation task" in str(exc):
        return RemoteError("ActorCreationError", f"{what}: building the owner in its actor failed", str(exc))
    if isinstance(exc, (rex.RayActorError, rex.ActorUnavailableError, rex.WorkerCrashedError, rex.NodeDiedError)):
        return PeerFailureError(f"{what}: the Ray actor died ({type(exc).__name__})")
    if isinstance(exc, rex.GetTimeoutError):
        return ServiceTimeoutError(f"{what}: no answer in time (the actor is alive)")
    return exc


def get(refs: Any, what: str, timeout: float | None = None) -> Any:
    """``ray.get`` with our errors."""
    ray = import_ray()
    try:
        return ray.get(refs, timeout=timeout)
    except Exception as exc:  # noqa: BLE001 - translated
        translated = translate(exc, what)
        if translated is exc:
            raise
        raise translated from None


class RayFuture:
    """The answer to one Ray call: ``result(timeout)`` and ``done()``, like the transports' futures."""

    __slots__ = ("ref", "what")

    def __init__(self, ref: Any, what: str):
        self.ref, self.what = ref, what

    def done(self) -> bool:
        return self.ready(0)

    def ready(self, timeout: float) -> bool:
        """Whether the answer (or the actor's death) arrived within ``timeout`` seconds."""
        ready, _ = import_ray().wait([self.ref], timeout=timeout)
        return bool(ready)

    def result(self, timeout: float | None = None) -> Any:
        return get(self.ref, self.what, timeout)


# ---------------------------------------------------------------------------------------------- hosting
class HostActor:
    """The body of a hosting actor: builds the twin in its constructor and runs allowed methods on it."""

    def __init__(self, twin_factory: Callable[[], Any], allowed: Callable[[str], bool]):
        import torch

        torch.set_num_threads(1)
        self.twin = twin_factory().start()
        self.allowed = allowed

    def ready(self) -> int:
        return os.getpid()

    def call(self, method: str, args: tuple, kwargs: dict) -> Any:
        if not self.allowed(method):
            raise RemoteError("PermissionError", f"{method!r} is not a client operation")
        return getattr(self.twin, method)(*args, **kwargs)

    def stop(self) -> None:
        self.twin.shutdown()


def remote(handle: Any, method: str, args: tuple, what: str) -> RayFuture:
    """Call ``method`` of an actor without waiting; the future raises our errors (as does a refused call)."""
    try:
        ref = getattr(handle, method).remote(*args)
    except Exception as exc:  # noqa: BLE001 - e.g. the actor is known dead already
        raise translate(exc, what) from None
    return RayFuture(ref, what)


class RayEndpoint:
    """A command endpoint over an actor handle: ``submit((method, args, kwargs))`` returns a :class:`RayFuture`.

    Picklable (the handle is), so it works from any process connected to the cluster.
    """

    def __init__(self, handle: Any, name: str):
        self.handle, self.name = handle, name

    def submit(self, command: tuple) -> RayFuture:
        method, args, kwargs = command
        return remote(self.handle, "call", (method, args, kwargs), f"{self.name}.{method}")


class RayActor:
    """An actor this process creates and owns: launched at once, waited for with :meth:`wait_ready`, called,
    watched and stopped. Its class needs ``ready()`` (returning the pid) and ``stop()`` (releasing the resource).

    Args:
        cls: the actor's class; built in the actor with ``args``.
        name: for messages.
        resources: what it reserves and how it is supervised.
        max_concurrency: at least this many concurrent calls (beside ``resources.max_concurrency``).
    """

    def __init__(self, cls: type, name: str, args: tuple, resources: ActorResources | None = None, *,
                 max_concurrency: int | None = None):
        ray = require_connection(name)
        self.name, self.resources = name, resources or ActorResources()
        self.handle = ray.remote(cls).options(**self.resources.options(max_concurrency=max_concurrency)).remote(*args)
        self.pid: int | None = None

    def wait_ready(self) -> "RayActor":
        """Wait until the constructor finished (the actor is killed if it failed); return ``self``.

        Raises:
            RemoteError: the constructor raised (with the actor's traceback text).
            PeerFailureError: the actor died while starting.
            ServiceTimeoutError: not ready within ``resources.startup_timeout`` (e.g. resources no node has).
        """
        ray, timeout = import_ray(), self.resources.startup_timeout
        try:
            self.pid = int(get(self.handle.ready.remote(), f"{self.name} start", timeout))
        except ServiceTimeoutError:
            ray.kill(self.handle)
            raise ServiceTimeoutError(
                f"{self.name}: the Ray actor was not ready within {timeout} s (are the requested resources "
                f"{dict(self.resources.custom)} and num_cpus={self.resources.num_cpus or 0} available in the cluster?)"
            ) from None
        except BaseException:
            ray.kill(self.handle)
            raise
        return self

    def submit(self, method: str, *args: Any) -> RayFuture:
        return remote(self.handle, method, args, f"{self.name}.{method}")

    def call(self, method: str, *args: Any, timeout: float | None = None) -> Any:
        return self.submit(method, *args).result(timeout)

    @property
    def is_alive(self) -> bool:
        """Whether the actor is alive, as the cluster's control store sees it."""
        ray = import_ray()
        if not ray.is_initialized():
            return False
        from ray._private import state

        info = state.actors(actor_id=self.handle._actor_id.hex())
        return bool(info) and info.get("State") == "ALIVE"

    def stop(self, timeout: float | None = None) -> None:
        """Let the actor release its resource (``stop()``), then end it. Idempotent; never raises for a dead actor."""
        ray = import_ray()
        if not ray.is_initialized():
            return
        try:
            ray.get(self.handle.stop.remote(), timeout=10.0 if timeout is None else timeout)
        except Exception:  # noqa: BLE001 - dead or stuck: killed below either way
            pass
        try:
            ray.kill(self.handle, no_restart=True)
        except Exception:  # noqa: BLE001
            pass
