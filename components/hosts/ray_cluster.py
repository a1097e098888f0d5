"""The Ray cluster of a run: joined at ``ray.address`` or started on loopback (`ray_cluster`), what it can offer
checked while planning (`check_resources_offered`), and what a killed driver's cluster left removed at the next
start (`remove_dead_clusters`). The hosts themselves are `components.hosts.ray`."""

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
from typing import Any, Callable, Dict, Iterator, Mapping, Optional

from transports.kernel.errors import ConfigurationError
from transports.kernel.options import bounded, check_instance
from transports.ray import import_ray

from .base import Resources
from .signals import CLUSTER_SIGNALS, signals_blocked

log = logging.getLogger(__name__)


LOOPBACK = "127.0.0.1"
DEFAULT_NAMESPACE = "rl_services"


# ---------------------------------------------------------------------------------------------- cluster
@dataclass
class RayClusterConfig:
    """``ray.*`` in YAML: the cluster that components placed on ``ray`` use (whatever ``service`` is). ``address``
    joins a running cluster; ``None`` starts a local one on loopback.

    Attributes:
        address: join this cluster (``host:port``, or ``auto`` for one started with ``ray start``); ``None`` starts a
            local one on 127.0.0.1.
        namespace: Ray namespace of named actors (registries, named owners).
        num_cpus: CPUs a locally started cluster advertises (``None``: the machine's).
        resources: custom resources of a locally started head node.
        temp_dir: Ray's session dir for a locally started cluster (short path: Unix sockets live there; ``None``: a
            fresh one).
        connect_timeout: seconds to wait for the cluster at ``address`` to answer (raise it to wait for a cluster that
            is still starting).
    """

    address: Optional[str] = None
    namespace: str = DEFAULT_NAMESPACE
    num_cpus: Optional[float] = bounded(None, ge=0)
    resources: Dict[str, float] = field(default_factory=dict)
    temp_dir: Optional[str] = None
    connect_timeout: float = bounded(5.0, gt=0, unit="seconds")

    def __post_init__(self):
        check_instance(self, path="ray")

    def rules(self) -> tuple[tuple[str, bool, str], ...]:
        """What must hold between fields, as ``(field to blame, holds, what is wrong)``: a ``temp_dir`` short enough
        for the Unix sockets Ray makes under it."""
        return (("temp_dir", self.temp_dir is None or len(self.temp_dir) <= SOCKET_ROOM,
                 f"ray.temp_dir is {len(self.temp_dir or '')} characters long; Ray makes Unix sockets under it, whose "
                 f"paths may not exceed 107 bytes: use a directory of at most {SOCKET_ROOM} characters "
                 "(e.g. /tmp/ray_mine), or leave it unset"),)


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


def reachable(address: str, timeout: float) -> None:
    """Wait until something listens at ``host:port`` (Ray's own connect retries for minutes: a mistyped
    address would hang the run), else raise naming the address: at once where the connection is refused (nothing
    listens), after ``timeout`` where it goes unanswered. ``auto`` is left to Ray (it fails fast)."""
    import socket

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
"""Seconds a question to the cluster's control store (GCS) may take, once the run is ending on a signal, before its
answer is taken as "none": the store of a cluster whose daemons were ended under the run (a locally started one
blocks SIGTERM, but not SIGKILL or the out-of-memory killer; a joined one is stopped by whoever runs it) accepts
questions and never answers them. While the run goes on, a question waits as long as the store takes (a slow answer
under load is no reason to take a live actor for dead)."""


class _Silent:
    """How long a question to the control store may wait (``None``: as long as it takes; set when the run is ending
    on a signal, reset by each new connection), and since when the store has not answered (then no question waits)."""

    patience: float | None = None
    since: float | None = None


def winding_down() -> None:
    """The run is ending on a signal: from now on no question to the control store waits more than
    `CONTROL_STORE_S` seconds."""
    _Silent.patience = CONTROL_STORE_S


def answered(ask: Callable[[], Any]) -> Any:
    """``ask()``'s answer; once the run is winding down, ``None`` where it takes longer than its patience or the store
    has not answered a question before (the question is left to finish on a daemon thread, which does not keep the
    process from ending)."""
    if _Silent.patience is None:
        return ask()
    if _Silent.since is not None:
        return None
    box: list = []
    thread = threading.Thread(target=lambda: box.append(ask()), name="ray-control-store", daemon=True)
    thread.start()
    thread.join(_Silent.patience)
    if not box:
        _Silent.since = time.monotonic()
        log.warning("ray: the cluster's control store did not answer within %g s: taking every actor as gone",
                    _Silent.patience)
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
            driver = 0
        if driver > 0 and os.path.exists(f"/proc/{driver}"):
            continue
        if driver <= 0 and not _untouched(where, ABANDONED_S):  # no driver named: being made, or half removed
            continue
        holders = processes_holding(where)
        if driver <= 0 and holders:
            continue
        for pid in filter(_ray_process, holders):  # never a process of ours that still holds a file of it (a
            # test process that once joined that cluster keeps its driver log open)
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(where, ignore_errors=True)
        removed.append(where)
    if removed:
        log.info("ray: removed what %d killed runs left: %s", len(removed), ", ".join(removed))
    return removed


ABANDONED_S = 60.0
"""Age after which a session directory that names no driver (killed between making it and writing ``driver.pid``, or
left half removed while Ray still wrote into it) and that no process holds counts as left behind."""


def _untouched(where: str, seconds: float) -> bool:
    try:
        return time.time() - os.stat(where).st_mtime > seconds
    except OSError:
        return False


def _ray_process(pid: int) -> bool:
    """Whether ``pid`` is one of Ray's own processes: its daemons (run from Ray's package directory) and workers
    (``ray::...``), never a driver."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            args = f.read().decode(errors="replace").split("\0")[:3]
    except OSError:
        return False
    return args[0].startswith("ray::") or any(f"{os.sep}ray{os.sep}" in arg and "-packages" in arg for arg in args)


def processes_holding(where: str) -> list[int]:
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
        if any(link.startswith(inside) or link == where for link in links):
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
    _Silent.since = _Silent.patience = None
    try:  # a SIGTERM that arrived while the cluster started is raised as it ends: the cluster is stopped too
        with _signals_kept():
            if config.address:
                reachable(config.address, config.connect_timeout)
                ray.init(address=config.address, **common)
            else:
                # a short session dir of its own (Ray's Unix sockets live there), removed with the cluster
                remove_dead_clusters()
                temp_dir = config.temp_dir or (own_dir := _own_temp_dir())
                # in its daemons and workers: neither a batch system's warning nor a SIGTERM to the whole process
                # group (or job step) ends them; the driver stops its services on the cluster, then the cluster. A
                # signal that arrives meanwhile reaches this process once its own handlers are back.
                with signals_blocked(CLUSTER_SIGNALS), _signals_kept():
                    ray.init(_node_ip_address=LOOPBACK, num_cpus=config.num_cpus,
                             resources=dict(config.resources) or None, include_dashboard=False, _temp_dir=temp_dir,
                             **common)
        yield not config.address
    finally:
        if config.address:
            ray.shutdown()  # a joined cluster keeps running; only the connection ends
        else:
            _shutdown_started(ray)
        if own_dir is not None:
            shutil.rmtree(own_dir, ignore_errors=True)


def _shutdown_started(ray: Any) -> None:
    """Disconnect from the local cluster this process started, then end every process of it at once (SIGKILL): its
    daemons and workers block SIGTERM (`CLUSTER_SIGNALS`), so Ray's own shutdown would
    give each daemon a second to heed a SIGTERM it never sees. The services on the cluster have stopped by now; its
    workers and agents (started by the raylet, holding its session's files) go with the daemons."""
    from ray._private import worker

    node, worker._global_node = worker._global_node, None  # so ray.shutdown only disconnects this driver
    try:
        ray.shutdown()
    finally:
        if node is not None:
            node.kill_all_processes(check_alive=False, allow_graceful=False, wait=True)
            killed = list(filter(_ray_process, processes_holding(node.get_session_dir_path())))
            for pid in killed:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + KILLED_S  # gone before the driver says the run ended
            while any(map(_running, killed)) and time.monotonic() < deadline:
                time.sleep(0.01)


KILLED_S = 2.0
"""Seconds a driver waits for the processes of its cluster it killed to end (the kernel frees their memory first)."""


def _running(pid: int) -> bool:
    """Whether ``pid`` is a process that has not ended (a zombie has)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def namespace() -> str:
    """The namespace of the current Ray connection."""
    ray = import_ray()
    return ray.get_runtime_context().namespace if ray.is_initialized() else DEFAULT_NAMESPACE


def require_connection(what: str) -> Any:
    """The ``ray`` module, once this process is connected to a cluster.

    Args:
        what: names the component placed on ``ray``, for the message.

    Raises:
        ConfigurationError: this process is not connected to a Ray cluster.
    """
    ray = import_ray()
    if not ray.is_initialized():
        raise ConfigurationError(
            f"{what} is placed on 'ray' but this process is not connected to a Ray cluster: run it under the "
            "launcher (service=ray) or inside components.hosts.ray.ray_cluster()",
            path="service",
        )
    return ray
