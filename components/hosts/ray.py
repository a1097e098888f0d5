"""``ray``: the target lives in a Ray actor, built from the factory inside the actor.

``start()`` returns once the actor's constructor built the target (an error there surfaces at ``start()``
with the actor's traceback text); the target's serving loop runs on a thread of the actor; control calls
are actor calls. The actor reserves what `Resources` asks for and, with
``max_restarts``, Ray restarts it after a crash. The cluster itself is joined or started on loopback by
`ray_cluster` (re-exported here). Errors are ours, never raw Ray exceptions (see `transports.ray`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from typing import Any, Mapping

from transports.kernel.errors import ServiceTimeoutError
from transports.kernel.placements import Placement, Reach, register
from transports.ray import DELIVER, deliver, get, import_ray, remote

from .base import DEFAULT_STOP_TIMEOUT, FuturePending, Host, Pending, Resources, RunSetting, build_and_serve, close_target
from .ray_cluster import (RayClusterConfig, answered, check_resources_offered, namespace, ray_cluster, reachable,
                          require_connection, winding_down)
from .settings import settings_of

log = logging.getLogger(__name__)

__all__ = ["HostActor", "RayClusterConfig", "RayHost", "WarmActors", "actor_options", "namespace", "ray_cluster",
           "require_connection"]


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
    """Actors started ahead of their hosts (`RayHost.warm`), by the options they were started with."""

    def __init__(self):
        self._by_options: dict[str, list] = {}
        self._lock = threading.Lock()

    @staticmethod
    def _key(options: Mapping[str, Any]) -> str:
        return repr(sorted(options.items()))

    def add(self, options: Mapping[str, Any], handle: Any) -> None:
        """Keep ``handle``, an actor started with ``options``, for the next host that asks for them."""
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

_local_pids = RunSetting(None)
"""The pids of the actors of a cluster the session started on this machine, else ``None`` (a joined cluster's
actors may run elsewhere)."""

LEFT_SEGMENTS_WAIT_S = 0.0
"""How long a session that started its cluster waits, after stopping it, for its actors' processes to end before
it unlinks the shared-memory segments the ended ones left. None: a driver kept alive after a cluster that went down
under it can die of Ray's own check on a question to the control store still in flight (a C++ abort)."""


WARM_IMPORTS = ("torch", "tensordict", "components.commands", "components.inference.target", "components.replay.storage")
"""What a warm actor imports while it waits for its target (what most targets import first)."""


def address_of_node(node_id: str) -> str | None:
    """The address of the Ray node ``node_id`` (as it joined the cluster: ``ray start --node-ip-address``)."""
    ray = import_ray()
    return next((n["NodeManagerAddress"] for n in ray.nodes() if n["NodeID"] == node_id), None)


class HostActor:
    """The body of every hosting actor: builds the target (in its constructor, or in `build` for an actor
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

    def build(self, factory) -> tuple[int, str]:
        """Build the target of a warm actor; returns what `ready` does."""
        self.target, self._stop, self._serving = build_and_serve(factory)
        return self.ready()

    def ready(self) -> tuple[int, str]:
        """The actor's pid and its node's id, once its target was built (Ray runs calls after the constructor)."""
        return os.getpid(), self.node_id()

    def node_id(self) -> str:
        """The id of the Ray node the actor runs on."""
        import ray

        return ray.get_runtime_context().get_node_id()

    def call(self, method: str, args: tuple) -> Any:
        """Run ``method(*args)`` on the target and return its answer (a control call of the host)."""
        return getattr(self.target, method)(*args)

    def deliver(self, endpoint_id: str, payload: Any) -> Any:
        """Hand a transport request to its server endpoint inside the actor; returns its future."""
        return deliver(endpoint_id, payload)

    def shutdown(self) -> None:
        """Stop the target's serving loop and close the target (nothing for a warm actor never built)."""
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
        self._address: str | None = None
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
            pid, node = get(self._ready_ref, f"{self.name} start", timeout)
            self._pid, self._address = int(pid), address_of_node(node)
            log.info("%s: on the Ray node at %s (pid %d)", self.name, self._address, self._pid)
            if _local_pids.value is not None:
                _local_pids.value.append(self._pid)
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
        the end); ``settings`` holds `RayClusterConfig` fields (``ray.*`` in YAML). Actors started warm
        (`warm`) and not taken by a host are ended with the session."""
        config = settings_of(RayClusterConfig, settings)
        pids: list[int] = []
        try:
            with ray_cluster(config) as started, _warm.holding(WarmActors()), \
                    _local_pids.holding(pids if started else None):
                log.info("ray cluster: %s", "started on 127.0.0.1" if started else f"joined {config.address or 'the connected one'}")
                try:
                    yield
                finally:
                    _warm.value.end()
        finally:
            # An actor unlinks its segments as it stops, or its resource tracker does once it died; but where Ray
            # killed an actor's whole process group (a worker it took for dead, a cluster that went down under the
            # run), its tracker went with it: what they had not unlinked yet is unlinked here.
            from transports.segments import remove_segments_left_by  # torch: never loaded by planning alone

            if removed := remove_segments_left_by(pids, LEFT_SEGMENTS_WAIT_S):
                log.info("ray: unlinked %d shared-memory segments its stopped actors left: %s", len(removed),
                         ", ".join(removed))

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
    def winding_down(cls) -> None:
        winding_down()

    @classmethod
    def check_session(cls, settings: Mapping[str, Any], placed: Mapping[str, Resources]) -> None:
        check_resources_offered(settings, placed)
        if settings.get("address"):  # a cluster that does not answer is refused now, not after the run started
            reachable(str(settings["address"]), float(settings.get("connect_timeout") or 5.0))

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

    def shutdown(self, timeout: float | None = None) -> None:
        """Let the target release its resource, then end the actor. Idempotent; never raises for a dead actor."""
        if self._handle is None:
            return
        ray = import_ray()
        handle, self._handle = self._handle, None
        if not ray.is_initialized():
            return
        try:
            ray.get(handle.shutdown.remote(), timeout=DEFAULT_STOP_TIMEOUT if timeout is None else timeout)
        except Exception:  # noqa: BLE001 - dead or stuck: killed below either way
            pass
        try:
            ray.kill(handle, no_restart=True)
        except Exception:  # noqa: BLE001
            pass

    @property
    def is_alive(self) -> bool:
        """Whether the actor is alive, as the cluster's control store sees it; once the run winds down on a signal,
        ``False`` where the store does not answer within
        `CONTROL_STORE_S` (a cluster that is going down: a SIGTERM to the whole
        process group, a Slurm job's end, reached Ray's daemons too)."""
        ray = import_ray()
        if self._handle is None or not ray.is_initialized():
            return False
        from ray._private import state

        actor_id = self._handle._actor_id.hex()
        info = answered(lambda: state.actors(actor_id=actor_id))
        return bool(info) and info.get("State") == "ALIVE"

    @property
    def node_address(self) -> str | None:
        """The address of the Ray node the actor runs on."""
        return self._address

    @property
    def pid(self) -> int | None:
        return self._pid

    @property
    def handle(self) -> Any:
        return self._handle


PLACEMENT = register(Placement("ray", RayHost, Reach.NETWORK,
                                summary="a Ray actor, anywhere in the Ray cluster"))

