"""Hosting a direct owner elsewhere: on a thread, in a child process or in a Ray actor, driven by
acknowledged commands.

A service whose operations are method calls (replay buffer, logger) is built as its ``direct`` twin where
the owner lives, and clients send ``(method, args, kwargs)`` over a request/reply transport (``thread`` in
process, ``queue`` across processes). Every call returns the method's result or raises its exception at the
call site; only the component's client operations are accepted (a client cannot call ``shutdown``). In a Ray
actor the commands are Ray calls (see :mod:`components.ray_support`).
"""

from __future__ import annotations

import functools
import threading
from dataclasses import dataclass
from typing import Any, Callable

from transports.base import Batch, RequestReplyTransport, ServerEndpoint
from transports.errors import RemoteError, ServiceError

from .process import ChildProcess

POLL = 0.05


def hosted(method):
    """Route a domain operation called on a thread- or process-placed owner through the owner's own client
    (``self._remote``); on a direct owner (and on the hosted twin) the method runs as written."""
    name = method.__name__

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        if self._remote is not None:
            return getattr(self._remote, name)(*args, **kwargs)
        return method(self, *args, **kwargs)

    return wrapper


@dataclass(frozen=True)
class Allowed:
    """The operations a client may invoke: exact names, plus names starting with one of ``prefixes``."""

    names: frozenset
    prefixes: tuple = ()

    def __call__(self, method: str) -> bool:
        return method in self.names or (any(method.startswith(p) for p in self.prefixes) and not method.startswith("_"))


class CommandLoop:
    """Executes commands from ``endpoint`` on ``target`` until ``stop`` is set, one at a time, in order."""

    def __init__(self, target: Any, endpoint: ServerEndpoint, allowed: Allowed):
        self.target, self.endpoint, self.allowed = target, endpoint, allowed

    def run(self, stop: threading.Event) -> None:
        try:
            while not stop.is_set():
                batch = self.endpoint.collect(64, 1, 0.0, POLL)
                if batch is None:
                    continue
                for i, (method, args, kwargs) in enumerate(batch.requests):
                    single = Batch([batch.handles[i]], enqueued=[batch.enqueued[i]])
                    if not self.allowed(method):
                        self.endpoint.fail(single, RemoteError("PermissionError", f"{method!r} is not a client operation"))
                        continue
                    try:
                        result = getattr(self.target, method)(*args, **kwargs)
                    except ServiceError as exc:  # our own errors (layout, configuration) keep their type
                        self.endpoint.fail(single, exc)
                        continue
                    except Exception as exc:  # noqa: BLE001 - raised again at the call site
                        self.endpoint.fail(single, RemoteError.from_exception(exc))
                        continue
                    self.endpoint.reply(single, [result])
        finally:
            self.endpoint.close("the service was shut down")


class CommandClient:
    """Base of command clients: ``_call(method, *args, **kwargs)`` is one acknowledged round trip.

    Picklable along the rules of its transport; it has no lifecycle methods.
    """

    def __init__(self, endpoint: Any):
        self._endpoint = endpoint

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return self._endpoint.submit((method, args, kwargs)).result()


class Host:
    """Runs a direct twin on a thread or in a child process and hands out command endpoints.

    Args:
        name: thread or process name.
        twin_factory: picklable callable returning the *unstarted* direct owner to host.
        placement: ``thread``, ``process`` or ``ray``.
        resources: :class:`~components.ray_support.ActorResources` of a ``ray`` host.
        allowed: the client operations.
        max_clients: command endpoints a process host can hand out.
        startup_timeout: seconds the twin may take to start.
    """

    def __init__(self, name: str, twin_factory: Callable[[], Any], placement: str, allowed: Allowed,
                 *, max_clients: int = 64, startup_timeout: float = 60.0, resources: Any = None):
        self.name, self.twin_factory, self.placement, self.allowed = name, twin_factory, placement, allowed
        self.max_clients, self.startup_timeout, self.resources = max_clients, startup_timeout, resources
        self.transport: RequestReplyTransport | None = None
        self.child: ChildProcess | None = None
        self.actor: Any = None  # placement ray: the hosting RayActor
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def start(self) -> None:
        if self.placement == "ray":
            from .ray_support import HostActor, RayActor

            self.actor = RayActor(HostActor, self.name, (self.twin_factory, self.allowed), self.resources).wait_ready()
            return
        if self.placement == "thread":
            from transports.thread import ThreadTransport

            self.transport = ThreadTransport()
            ready: dict = {}
            started = threading.Event()
            self._thread = threading.Thread(target=self._host_thread, args=(ready, started), name=self.name, daemon=True)
            self._thread.start()
            started.wait()
            if "error" in ready:
                self._thread.join()
                raise ready["error"]
            self.transport.mark_serving(0)
            return
        from transports.queue import QueueTransport

        self.transport = QueueTransport(max_clients=self.max_clients)
        self.child = ChildProcess(
            self.name, _host_in_child, (self.twin_factory, self.transport.server_side(), self.allowed),
            startup_timeout=self.startup_timeout, on_death=lambda reason: self.transport.mark_dead(stopped=False),
        )
        self.transport.mark_serving(self.child.start())

    def _host_thread(self, ready: dict, started: threading.Event) -> None:
        try:
            twin = self.twin_factory().start()  # the SDK is built on the thread that serves it
        except BaseException as exc:  # noqa: BLE001 - raised at start()
            ready["error"] = exc
            started.set()
            return
        started.set()
        try:
            CommandLoop(twin, self.transport.server(), self.allowed).run(self._stop)
        finally:
            twin.shutdown()
            if not self._stop.is_set():
                self.transport.mark_dead(stopped=False)

    def endpoint(self) -> Any:
        if self.actor is not None:
            from .ray_support import RayEndpoint

            return RayEndpoint(self.actor.handle, self.name)
        return self.transport.client()

    @property
    def is_alive(self) -> bool:
        if self.actor is not None:
            return self.actor.is_alive
        if self._thread is not None:
            return self._thread.is_alive()
        return self.child is not None and self.child.is_alive

    def stop(self, timeout: float | None = None) -> None:
        if self.actor is not None:
            self.actor.stop(timeout)
            self.actor = None
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout if timeout is not None else 30.0)
            self._thread = None
        if self.child is not None:
            self.child.stop(timeout)
            self.child = None
        if self.transport is not None:
            self.transport.mark_dead(stopped=True)
            self.transport.close()


class _HostedChild:
    def __init__(self, twin_factory, transport, allowed):
        import torch

        torch.set_num_threads(1)
        self.twin = twin_factory().start()
        self.loop = CommandLoop(self.twin, transport.server(), allowed)

    def run(self, stop: threading.Event) -> None:
        self.loop.run(stop)

    def handle(self, command: str, payload: Any) -> Any:
        raise ValueError(f"unknown command {command!r}")

    def close(self) -> None:
        self.twin.shutdown()


def _host_in_child(twin_factory, transport, allowed) -> _HostedChild:
    return _HostedChild(twin_factory, transport, allowed)
