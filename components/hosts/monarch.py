"""``monarch``: the target lives in a Monarch actor, in a proc of its own on this machine's host mesh.

``start()`` returns once the actor built the target (an error there surfaces at ``start()`` as a
`RemoteError` with the actor's traceback text); the target's serving loop runs on a
thread of the actor; control calls run one at a time, in the order sent, on a thread of their own, and answer through an
explicit response port (the actor keeps taking calls, transport requests among them, while one runs). A proc that
dies is a peer failure within 0.1 s for a caller waiting on it (its pid is watched; Monarch's own supervision
reports it seconds later; from the first Monarch host on, this process logs such reports instead of ending the
driver, which is Monarch's default). ``stop()`` asks the target to close, then stops the proc. Monarch's procs talk
over Unix sockets by default: nothing listens on the network. Monarch is imported when a Monarch owner starts
(`components.hosts.monarch_actor` holds the actor), so the placement is known to every plan without it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any, Iterator, Mapping

from transports.kernel.errors import PeerFailureError, RemoteError
from transports.kernel.placements import Placement, Reach, register
from transports.monarch import ActorRef, call, import_monarch, translate

from .base import DEFAULT_STOP_TIMEOUT, FuturePending, Host, Pending, RunSetting

log = logging.getLogger(__name__)


class MonarchHost(Host):
    """Builds the target in a Monarch actor, in a proc of its own spawned on this machine's host mesh."""

    placement = "monarch"
    command_transport = "monarch"
    shares_memory = True  # its proc runs on this machine's host mesh
    process_memory_gb = 0.45  # a proc that imported torch, like a Ray actor's worker

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._procs: Any = None
        self._ref: ActorRef | None = None
        self._ready: Any = None
        self._stopped = False

    def _launch(self) -> None:
        from .monarch_actor import HostActor  # imports Monarch: only where a Monarch owner starts

        _faults_to_callers()
        self._procs = import_monarch().this_host().spawn_procs(per_host={"procs": 1})
        self._actor = self._procs.spawn(self.name.replace("-", "_"), HostActor, self.factory)
        self._ready = self._actor.ready.call_one()

    def wait_ready(self) -> None:
        timeout = self.resources.startup_timeout
        try:
            pid, hostname = self._ready.get(timeout=timeout)
        except BaseException as exc:  # noqa: BLE001 - translated below
            self.shutdown(1.0)
            if isinstance(exc, TimeoutError):
                from transports.kernel.errors import ServiceTimeoutError

                raise ServiceTimeoutError(f"{self.name}: the Monarch actor was not ready within {timeout} s") from None
            text = str(exc)
            raise RemoteError("MonarchActorError", f"{self.name}: building the target in its actor failed: "
                              f"{text.splitlines()[0][:200]}", text) from None
        self._ref = ActorRef(self._actor, int(pid), hostname)

    def submit(self, method: str, *args: Any) -> Pending:
        if self._ref is None or self._stopped:
            raise PeerFailureError(f"{self.name} is not running")
        if not self._ref.runs():
            raise PeerFailureError(self._lost())
        future = call(self._ref, "call", (method, args), f"{self.name}.{method}")
        future.on_death = self._lost
        return FuturePending(future)

    def _lost(self) -> str:
        reason = f"the {self.name} Monarch proc (pid {self.pid}) died"
        self._died(reason)
        return reason

    def shutdown(self, timeout: float | None = None) -> None:
        """Let the target release its resource, then stop the proc (in a run, see `session`, the proc's end is
        awaited when the run's session ends). Idempotent; never raises for a dead proc."""
        if self._procs is None or self._stopped:
            return
        self._stopped = True
        timeout = DEFAULT_STOP_TIMEOUT if timeout is None else timeout
        deadline = time.monotonic() + timeout
        if self._ref is not None and self._ref.runs():  # half the budget to close the target, the rest for the proc
            try:
                self._actor.finish.call_one().get(timeout=timeout / 2)
            except Exception as exc:  # noqa: BLE001 - dead or stuck: the proc is stopped below either way
                log.debug("%s: stop: %s", self.name, translate(exc, self.name))
        procs, self._procs = self._procs, None
        try:
            stopping = procs.stop()
        except Exception as exc:  # noqa: BLE001 - a mesh Monarch already tore down
            log.debug("%s: stopping its proc: %s", self.name, exc)
            return
        args = (self.name, stopping, max(0.5, deadline - time.monotonic()))
        deferred = _stopping.value
        if deferred is None:
            _await_stop(*args)
            return
        deferred.append(threading.Thread(target=_await_stop, args=args, name=f"{self.name}-proc-stop"))
        deferred[-1].start()  # in a run: the proc stops beside the others, the session waits for it

    @classmethod
    @contextlib.contextmanager
    def session(cls, settings: Mapping[str, Any], *, run_dir: str | None = None) -> Iterator[None]:
        """Procs stop together in a run: each owner's target is closed when it stops, in the run's order, and its
        proc's teardown (about 1 s: the interpreter of a proc that imported torch ending) goes on beside the
        next owners'; leaving the session waits for every proc."""
        threads: list[threading.Thread] = []
        try:
            with _stopping.holding(threads):
                yield
        finally:
            for thread in threads:
                thread.join(DEFAULT_STOP_TIMEOUT + 1.0)

    @property
    def is_alive(self) -> bool:
        return self._ref is not None and not self._stopped and self._ref.runs() and self.death is None

    @property
    def pid(self) -> int | None:
        return None if self._ref is None else self._ref.pid

    @property
    def handle(self) -> ActorRef | None:
        return self._ref


PLACEMENT = register(Placement("monarch", MonarchHost, Reach.NETWORK,
                                summary="a Monarch actor in a proc of its own on this machine's host mesh"))

_stopping = RunSetting(None)  # in a session: the list of threads awaiting procs being stopped


def _await_stop(name: str, stopping: Any, timeout: float) -> None:
    try:
        stopping.get(timeout=timeout)
    except Exception as exc:  # noqa: BLE001 - a proc that does not stop in time is Monarch's to end
        log.debug("%s: stopping its proc: %s", name, exc)


_hook_lock = threading.Lock()


def _faults_to_callers() -> None:
    """Monarch ends the driver (``sys.exit`` on its main thread, seen as a ``KeyboardInterrupt``) when an actor fails
    and nothing handles it; our hosts report such failures to their callers instead (a failed build at ``start()``,
    a dead proc at the next call). Its reports arrive seconds after the failure, when the owner may be gone already,
    so from the first Monarch host on, this process logs them and goes on."""
    actor_api = import_monarch()
    with _hook_lock:
        if actor_api.unhandled_fault_hook is not _log_fault:
            actor_api.unhandled_fault_hook = _log_fault


def _log_fault(failure: Any) -> None:
    log.warning("monarch: an actor failed (its callers are told): %s", str(failure).splitlines()[0][:300])
