"""``ray``: the target lives in a Ray actor, built from the factory inside the actor.

``start()`` returns once the actor's constructor built the target (an error there surfaces at ``start()``
with the actor's traceback text); the target's serving loop runs on a thread of the actor; control calls
are actor calls. The actor reserves what :class:`~components.hosts.base.Resources` asks for and, with
``max_restarts``, Ray restarts it after a crash. The cluster itself is joined or started on loopback by
:func:`ray_cluster`. Errors are ours, never raw Ray exceptions (see :mod:`transports.ray`).
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import shutil
import signal
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping

from transports.errors import ConfigurationError, ServiceTimeoutError
from transports.ray import DELIVER, deliver, get, import_ray, remote

from .base import DEFAULT_STOP_TIMEOUT, FuturePending, Host, Pending, Resources, RunSetting, build_and_serve, close_target
from .signals import warning_signals_blocked

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
DEFAULT_NAMESPACE = "rl_services"


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
        connect_timeout: seconds to wait for the cluster at ``address`` to answer before giving up (raise it to wait
            for a cluster that is still starting).
    """

    address: str | None = None
    namespace: str = DEFAULT_NAMESPACE
    num_cpus: float | None = None
    resources: Mapping[str, float] = field(default_factory=dict)
    temp_dir: str | None = None
    connect_timeout: float = 5.0


SOCKET_ROOM = 107 - len("/session_2026-12-03_07-07-38_184296_4194304/sockets/plasma_store")
"""The longest ``ray.temp_dir`` whose session's socket paths fit the 107 bytes of a Unix socket path."""


def check_resources_offered(settings: Mapping[str, Any], placed: Mapping[str, Resources]) -> None:
    """Refuse resources that a locally started cluster cannot offer (its CPUs, GPUs and custom resources), instead of
    letting an actor wait out its ``startup_timeout``; a cluster joined at ``ray.address`` is asked by Ray itself."""
    if settings.get("address"):
        return
    offered = {"num_cpus": float(settings.get("num_cpus") or os.cpu_count() or 1), "num_gpus": float(_gpus())}
    custom = dict(settings.get("resources") or {})
    for name, resources in placed.items():
        for field_name, unit in (("num_cpus", "CPUs"), ("num_gpus", "GPUs")):
            asked = getattr(resources, field_name) or 0
            if asked > offered[field_name]:
                raise ConfigurationError(
                    f"components.{name}.resources.{field_name}={asked:g}, but the local Ray cluster has "
                    f"{offered[field_name]:g} {unit}" + (" (ray.num_cpus)" if field_name == "num_cpus" and
                                                        settings.get("num_cpus") else "")
                    + ": ask for less, or join a cluster that has them (ray.address)",
                    path=f"components.{name}.resources.{field_name}")
        for key, amount in dict(resources.custom).items():
            if amount > custom.get(key, 0):
                raise ConfigurationError(
                    f"components.{name}.resources.custom.{key}={amount:g}, but the local Ray cluster offers "
                    f"{custom.get(key, 0):g} of it: declare it under ray.resources, or join a cluster that has it "
                    "(ray.address)", path=f"components.{name}.resources.custom.{key}")


def _gpus() -> int:
    """The GPUs a local Ray cluster detects here (CUDA devices torch sees, where torch is loaded)."""
    import sys

    torch = sys.modules.get("torch")
    return torch.cuda.device_count() if torch is not None and torch.cuda.is_available() else 0


def _reachable(address: str, timeout: float) -> None:
    """Wait until something listens at ``host:port`` (Ray's own connect retries for minutes: a mistyped
    address would hang the run), else raise naming the address: at once where the connection is refused (nothing
    listens), after ``timeout`` where it goes unanswered. ``auto`` is left to Ray (it fails fast)."""
    import socket
    import time

    if address == "auto":
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    deadline, problem = time.monotonic() + timeout, "no port given"
    while port.isdigit():
        try:
            socket.create_connection((host or LOOPBACK, int(port)), timeout=max(0.1, min(2.0, timeout))).close()
            return
        except ConnectionRefusedError:  # nothing listens there now: no use waiting out the timeout
            raise ConfigurationError(f"no Ray cluster listens at ray.address={address!r} (connection refused); start "
                                     "one there (ray start --head) or leave ray.address unset to start a local one",
                                     path="ray.address") from None
        except OSError as exc:
            problem = exc.strerror or type(exc).__name__
        if time.monotonic() >= deadline:
            break
        time.sleep(0.5)
    raise ConfigurationError(f"no Ray cluster answers at ray.address={address!r} within {timeout:g} s ({problem}); "
                             "start one there (ray start --head) or leave ray.address unset to start a local one",
                             path="ray.address")


class _AuthNotice(logging.Filter):
    """Ray's notice of the authentication it chose (token authentication for a new local cluster, which stays on)
    goes to this module's log, and so to ``launcher.log``, not between the plan and the progress line."""

    LOGGER = "ray._private.authentication.authentication_token_setup"

    def filter(self, record: logging.LogRecord) -> bool:
        log.info("ray: %s", record.getMessage())
        return False

    @classmethod
    def install(cls) -> None:
        logger = logging.getLogger(cls.LOGGER)
        if not any(isinstance(f, cls) for f in logger.filters):
            logger.addFilter(cls())


CONTROL_STORE_S = 3.0
"""Seconds a question to the cluster's control store (GCS) may take before its answer is taken as "none": the store
of a cluster that is shutting down accepts questions and never answers them."""


class _Silent:
    """Whether the control store of the connected cluster stopped answering (reset by each new connection): from
    then on no question waits for it."""

    since: float | None = None


def _answered(ask: Callable[[], Any], timeout: float) -> Any:
    """``ask()``'s answer, or ``None`` where it takes longer than ``timeout`` seconds, or the control store has not
    answered a question before (the question is left to finish on a daemon thread, which does not keep the process
    from ending)."""
    if _Silent.since is not None:
        return None
    box: list = []
    thread = threading.Thread(target=lambda: box.append(ask()), name="ray-control-store", daemon=True)
    thread.start()
    thread.join(timeout)
    if not box:
        _Silent.since = time.monotonic()
        log.warning("ray: the cluster's control store did not answer within %g s: taking every actor as gone", timeout)
    return box[0] if box else None


OWN_TEMP_PREFIX = "rlsvc_ray_"
"""The session directories of local clusters this package starts: ``/tmp/rlsvc_ray_<random>``, holding ``driver.pid``."""


def _own_temp_dir() -> str:
    where = tempfile.mkdtemp(prefix=OWN_TEMP_PREFIX, dir="/tmp")
    with open(os.path.join(where, "driver.pid"), "w") as f:
        f.write(f"{os.getpid()}\n")
    return where


def remove_dead_clusters() -> list[str]:
    """Remove what local clusters of drivers that were killed outright left behind (a driver that gets SIGKILL stops
    nothing): their session directories, and the Ray processes still holding files there. Returns the directories.
    Called before a local cluster starts, so nothing of a dead run outlives the next one's start."""
    removed = []
    for where in glob.glob(f"/tmp/{OWN_TEMP_PREFIX}*"):
        try:
            with open(os.path.join(where, "driver.pid")) as f:
                driver = int(f.read().strip() or 0)
        except (OSError, ValueError):
            continue
        if driver <= 0 or os.path.exists(f"/proc/{driver}"):
            continue
        for pid in _holding(where):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(where, ignore_errors=True)
        removed.append(where)
    if removed:
        log.info("ray: removed what %d killed runs left: %s", len(removed), ", ".join(removed))
    return removed


def _holding(where: str) -> list[int]:
    """The processes with a file open, or their working directory, under ``where`` (``/proc``; Linux)."""
    inside, pids = where.rstrip("/") + "/", []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            links = [os.readlink(f"/proc/{entry}/cwd")]
            links += [os.readlink(f"/proc/{entry}/fd/{fd}") for fd in os.listdir(f"/proc/{entry}/fd")]
        except OSError:
            continue
        if any(link.startswith(inside) for link in links):
            pids.append(int(entry))
    return pids


@contextlib.contextmanager
def _signals_kept() -> Iterator[None]:
    """The process's own SIGTERM and SIGINT handlers, as they were before the block, restored after it: connecting
    installs Ray's (a crash dump, then the process dies of the signal), and a SIGTERM (Slurm's preemption, scancel)
    must reach the handler that shuts every service down in order and writes the run's summary."""
    kept = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in kept.items():
            if handler is not None:
                signal.signal(sig, handler)


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
    _AuthNotice.install()
    _Silent.since = None
    with _signals_kept():
        if config.address:
            _reachable(config.address, config.connect_timeout)
            ray.init(address=config.address, **common)
        else:
            # a short session dir of its own (Ray's Unix sockets live there), removed with the cluster
            remove_dead_clusters()
            temp_dir = config.temp_dir or (own_dir := _own_temp_dir())
            with warning_signals_blocked():  # in its daemons and workers: a batch system's warning must not end them
                ray.init(_node_ip_address=LOOPBACK, num_cpus=config.num_cpus, resources=dict(config.resources) or None,
                         include_dashboard=False, _temp_dir=temp_dir, **common)
    try:
        yield not config.address
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
            "launcher (service=ray) or inside components.hosts.ray.ray_cluster()",
            path="service",
        )
    return ray


def actor_options(resources: Resources, concurrency: int = 1) -> dict:
    """Ray actor options for ``resources`` (at least ``concurrency`` calls at once)."""
    opts: dict[str, Any] = {
        "num_cpus": 0 if resources.num_cpus is None else resources.num_cpus,
        "num_gpus": resources.num_gpus,
        "max_restarts": resources.max_restarts,
        "max_task_retries": resources.max_restarts,
        "max_concurrency": max(resources.max_concurrency, concurrency),
    }
    if resources.memory:
        opts["memory"] = int(resources.memory)
    if resources.custom:
        opts["resources"] = dict(resources.custom)
    return opts


# ---------------------------------------------------------------------------------------------- host
class WarmActors:
    """Actors started ahead of their hosts (:meth:`RayHost.warm`), by the options they were started with."""

    def __init__(self):
        self._by_options: dict[str, list] = {}
        self._lock = threading.Lock()

    @staticmethod
    def _key(options: Mapping[str, Any]) -> str:
        return repr(sorted(options.items()))

    def add(self, options: Mapping[str, Any], handle: Any) -> None:
        with self._lock:
            self._by_options.setdefault(self._key(options), []).append(handle)

    def take(self, options: Mapping[str, Any]) -> Any:
        """A warm actor started with exactly ``options``, or ``None``."""
        with self._lock:
            handles = self._by_options.get(self._key(options))
            return handles.pop(0) if handles else None

    def end(self) -> None:
        """End every actor no host took."""
        ray = import_ray()
        with self._lock:
            left, self._by_options = [h for hs in self._by_options.values() for h in hs], {}
        for handle in left if ray.is_initialized() else ():
            try:
                ray.kill(handle, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass


_warm = RunSetting(None)
"""The run's warm actors (inside a session), else ``None``: hosts made outside a session start their own."""


WARM_IMPORTS = ("torch", "tensordict", "components.commands", "components.inference.target", "components.replay.storage")
"""What a warm actor imports while it waits for its target (what most targets import first)."""


class HostActor:
    """The body of every hosting actor: builds the target (in its constructor, or in :meth:`build` for an actor
    started warm), serves it on a thread, runs control calls on it, and hands transport requests to their endpoints
    inside the actor."""

    def __init__(self, factory=None):
        if factory is None:  # started warm (RayHost.warm): import what targets need, then wait for build()
            import importlib

            for module in WARM_IMPORTS:
                importlib.import_module(module)
            self.target = None
            return
        self.target, self._stop, self._serving = build_and_serve(factory)

    def build(self, factory) -> int:
        """Build the target of a warm actor; returns the actor's pid, as :meth:`ready` does."""
        self.target, self._stop, self._serving = build_and_serve(factory)
        return os.getpid()

    def ready(self) -> int:
        return os.getpid()

    def node_id(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()

    def call(self, method: str, args: tuple) -> Any:
        return getattr(self.target, method)(*args)

    def deliver(self, endpoint_id: str, payload: Any) -> Any:
        return deliver(endpoint_id, payload)

    def stop(self) -> None:
        if self.target is None:  # a warm actor that was never given a target
            return
        self._stop.set()
        if self._serving is not None:
            self._serving.join(DEFAULT_STOP_TIMEOUT)
        close_target(self.target)


assert HostActor.deliver.__name__ == DELIVER


class RayHost(Host):
    """Builds the target in a Ray actor of the connected cluster."""

    placement = "ray"
    restarts_itself = True
    may_share_memory = True  # an actor on the driver's node hands rollouts over through shared memory
    command_transport = "ray"
    process_memory_gb = 0.45  # measured: 0.36-0.40 GB RSS per CartPole owner's actor

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._handle: Any = None
        self._pid: int | None = None
        self._ready_ref: Any = None

    def _launch(self) -> None:
        ray = require_connection(self.name)
        options = actor_options(self.resources, self.concurrency)
        warm = _warm.value.take(options) if _warm.value is not None else None
        if warm is not None:  # an actor of the same options, started with the session, is up already
            self._handle, self._ready_ref = warm, warm.build.remote(self.factory)
            return
        self._handle = ray.remote(HostActor).options(**options).remote(self.factory)
        self._ready_ref = self._handle.ready.remote()

    def wait_ready(self) -> None:
        ray, timeout = import_ray(), self.resources.startup_timeout
        try:
            self._pid = int(get(self._ready_ref, f"{self.name} start", timeout))
        except ServiceTimeoutError:
            ray.kill(self._handle)
            self._handle = None
            raise ServiceTimeoutError(
                f"{self.name}: the Ray actor was not ready within {timeout} s (are the requested resources "
                f"{dict(self.resources.custom)} and num_cpus={self.resources.num_cpus or 0} available in the cluster?)"
            ) from None
        except BaseException:
            ray.kill(self._handle)
            self._handle = None
            raise

    @classmethod
    @contextlib.contextmanager
    def session(cls, settings: Mapping[str, Any], *, run_dir: str | None = None):
        """Join the cluster at ``settings['address']`` (left running) or start a local one on 127.0.0.1 (stopped at
        the end); ``settings`` holds :class:`RayClusterConfig` fields (``ray.*`` in YAML). Actors started warm
        (:meth:`warm`) and not taken by a host are ended with the session."""
        config = RayClusterConfig(**{k: v for k, v in settings.items() if v is not None})
        with ray_cluster(config) as started, _warm.holding(WarmActors()):
            log.info("ray cluster: %s", "started on 127.0.0.1" if started else f"joined {config.address or 'the connected one'}")
            try:
                yield
            finally:
                _warm.value.end()

    @classmethod
    def warm(cls, expected) -> None:
        """Start one actor per expected host at once, each importing what targets import while the run's first
        owners start; a host of the same options takes one and builds its target there. Hosts Ray restarts
        (``max_restarts``) build theirs in the constructor, as Ray calls it again, so none is started for them."""
        if _warm.value is None:
            return
        ray = require_connection("warm actors")
        for resources, concurrency in expected:
            if resources.max_restarts == 0:
                options = actor_options(resources, concurrency)
                _warm.value.add(options, ray.remote(HostActor).options(**options).remote())

    @classmethod
    def check_session(cls, settings: Mapping[str, Any], placed: Mapping[str, Resources]) -> None:
        check_resources_offered(settings, placed)
        if settings.get("address"):  # a cluster that does not answer is refused now, not after the run started
            _reachable(str(settings["address"]), float(settings.get("connect_timeout") or 5.0))

    @classmethod
    def on_run_machine(cls, settings: Mapping[str, Any]) -> bool:
        return not settings.get("address")  # a joined cluster runs its actors on its own machines

    @classmethod
    def session_memory_gb(cls, settings: Mapping[str, Any]) -> float:
        # a local cluster's daemons (GCS, raylet, dashboard and runtime-env agents, log monitor): 0.5 GB RSS measured
        return 0.0 if settings.get("address") else 0.6

    def submit(self, method: str, *args: Any) -> Pending:
        return FuturePending(remote(self._handle, "call", (method, args), f"{self.name}.{method}"))

    def node_id(self) -> str:
        """The Ray node the actor runs on."""
        return get(self._handle.node_id.remote(), f"{self.name}.node_id", 60.0)

    def stop(self, timeout: float | None = None) -> None:
        """Let the target release its resource, then end the actor. Idempotent; never raises for a dead actor."""
        if self._handle is None:
            return
        ray = import_ray()
        handle, self._handle = self._handle, None
        if not ray.is_initialized():
            return
        try:
            ray.get(handle.stop.remote(), timeout=DEFAULT_STOP_TIMEOUT if timeout is None else timeout)
        except Exception:  # noqa: BLE001 - dead or stuck: killed below either way
            pass
        try:
            ray.kill(handle, no_restart=True)
        except Exception:  # noqa: BLE001
            pass

    @property
    def is_alive(self) -> bool:
        """Whether the actor is alive, as the cluster's control store sees it; ``False`` where the control store
        does not answer within :data:`CONTROL_STORE_S` (a cluster that is going down: a SIGTERM to the whole
        process group, a Slurm job's end, reached Ray's daemons too)."""
        ray = import_ray()
        if self._handle is None or not ray.is_initialized():
            return False
        from ray._private import state

        actor_id = self._handle._actor_id.hex()
        info = _answered(lambda: state.actors(actor_id=actor_id), CONTROL_STORE_S)
        return bool(info) and info.get("State") == "ALIVE"

    @property
    def pid(self) -> int | None:
        return self._pid

    @property
    def handle(self) -> Any:
        return self._handle

