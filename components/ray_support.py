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


class RayEndpoint:
    """A command endpoint over an actor handle: ``submit((method, args, kwargs))`` returns a :class:`RayFuture`.

    Picklable (the handle is), so it works from any process connected to the cluster.
    """

    def __init__(self, handle: Any, name: str):
        self.handle, self.name = handle, name

    def submit(self, command: tuple) -> RayFuture:
        method, args, kwargs = command
        try:
            ref = self.handle.call.remote(method, args, kwargs)
        except Exception as exc:  # noqa: BLE001 - e.g. the actor is known dead already
            translated = translate(exc, f"{self.name}.{method}")
            raise translated from None
        return RayFuture(ref, f"{self.name}.{method}")


def launch_actor(cls: type, name: str, args: tuple, resources: ActorResources, *, actor_name: str | None = None,
                 max_concurrency: int | None = None) -> Any:
    """Create an actor of ``cls`` without waiting for its constructor (see :func:`wait_ready`)."""
    ray = require_connection(name)
    options = resources.options(max_concurrency=max_concurrency)
    if actor_name is not None:
        options.update(name=actor_name, namespace=namespace())
    return ray.remote(cls).options(**options).remote(*args)


def wait_ready(handle: Any, name: str, resources: ActorResources, startup_timeout: float | None = None) -> int:
    """Wait until the actor's constructor finished; return its pid. The actor is killed if it fails.

    Raises:
        RemoteError: the constructor raised (with the actor's traceback text).
        PeerFailureError: the actor died while starting.
        ServiceTimeoutError: not ready within ``startup_timeout`` (e.g. resources that no node has).
    """
    ray = import_ray()
    startup_timeout = resources.startup_timeout if startup_timeout is None else startup_timeout
    try:
        return int(get(handle.ready.remote(), f"{name} start", startup_timeout))
    except ServiceTimeoutError:
        ray.kill(handle)
        raise ServiceTimeoutError(
            f"{name}: the Ray actor was not ready within {startup_timeout} s (are the requested resources "
            f"{dict(resources.custom)} and num_cpus={resources.num_cpus or 0} available in the cluster?)"
        ) from None
    except BaseException:
        ray.kill(handle)
        raise


def start_actor(cls: type, name: str, args: tuple, resources: ActorResources, *, actor_name: str | None = None,
                max_concurrency: int | None = None, startup_timeout: float | None = None) -> tuple[Any, int]:
    """Create an actor of ``cls`` and wait until its constructor finished; return (handle, pid)."""
    handle = launch_actor(cls, name, args, resources, actor_name=actor_name, max_concurrency=max_concurrency)
    return handle, wait_ready(handle, name, resources, startup_timeout)


def stop_actor(handle: Any, timeout: float | None = None) -> None:
    """Let the actor release its resource (``stop()``), then end it. Idempotent; never raises for a dead actor."""
    ray = import_ray()
    if not ray.is_initialized():
        return
    try:
        ray.get(handle.stop.remote(), timeout=10.0 if timeout is None else timeout)
    except Exception:  # noqa: BLE001 - dead or stuck: killed below either way
        pass
    try:
        ray.kill(handle, no_restart=True)
    except Exception:  # noqa: BLE001
        pass


def actor_alive(handle: Any) -> bool:
    """Whether the actor is alive, as the cluster's control store sees it."""
    ray = import_ray()
    if not ray.is_initialized():
        return False
    from ray._private import state

    info = state.actors(actor_id=handle._actor_id.hex())
    return bool(info) and info.get("State") == "ALIVE"
