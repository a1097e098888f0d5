"""Acknowledged commands: a service whose operations are method calls (replay buffer, logger, weight sync on a
remote host) is served as a *command target*: the resource, plus a loop that runs ``(method, args, kwargs)``
commands from a request/reply transport (``thread`` in process, ``queue`` across processes, ``ray`` in an
actor) one at a time, in order. Every call returns the method's result or raises its exception at the call
site; only the component's client operations are accepted (a client cannot call ``shutdown``).
"""

from __future__ import annotations

import contextlib
import functools
import threading
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from transports.base import Batch, ServerEndpoint
from transports.kernel.errors import RemoteError, ServiceError

POLL = 0.05
"""Seconds the loop waits for a command before it checks whether it should stop."""


def hosted(method):
    """Route a domain operation called on a remotely placed owner through the owner's own client
    (``self._remote``); on an owner whose resource lives in the caller the method runs as written."""
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


class _Serial:
    """Serves the requests of ``endpoint`` one at a time, in order, until ``stop`` is set: each answer is
    `_compute`'s result, or its exception raised again at the call site (our own errors keep their type)."""

    endpoint: ServerEndpoint

    def run(self, stop: threading.Event) -> None:
        try:
            while not stop.is_set():
                batch = self.endpoint.collect(64, 1, 0.0, POLL)
                if batch is None:
                    continue
                for handle, request, enqueued in zip(batch.handles, batch.requests, batch.enqueued):
                    single = Batch([handle], enqueued=[enqueued])
                    try:
                        answer = self._compute(handle, request)
                    except ServiceError as exc:  # our own errors (layout, configuration, permission) keep their type
                        self.endpoint.fail(single, exc)
                        continue
                    except Exception as exc:  # noqa: BLE001 - raised again at the call site
                        self.endpoint.fail(single, RemoteError.from_exception(exc))
                        continue
                    self.endpoint.reply(single, [answer])
        finally:
            self.endpoint.close("the service was shut down")

    def _compute(self, handle: Any, request: Any) -> Any:
        raise NotImplementedError


class CommandLoop(_Serial):
    """Executes commands from ``endpoint`` on ``target`` until ``stop`` is set, one at a time, in order (under
    ``lock`` when another loop serves the same target)."""

    def __init__(self, target: Any, endpoint: ServerEndpoint, allowed: Allowed, lock: Any = None):
        self.target, self.endpoint, self.allowed = target, endpoint, allowed
        self.lock = lock or contextlib.nullcontext()

    def _compute(self, handle: Any, request: Any) -> Any:
        method, args, kwargs = request
        if not self.allowed(method):
            raise RemoteError("PermissionError", f"{method!r} is not a client operation")
        with self.lock:
            return getattr(self.target, method)(*args, **kwargs)


class PayloadLoop(_Serial):
    """Serves the fixed-layout operations of a payload transport (``distributed``) on ``target``: each request's
    channel names its operation, ``ops[name](target, request)`` computes the answer TensorDict."""

    def __init__(self, target: Any, endpoint: ServerEndpoint, ops: Mapping[str, Callable], lock: Any):
        self.target, self.endpoint, self.ops, self.lock = target, endpoint, ops, lock

    def _compute(self, handle: Any, request: Any) -> Any:
        op = self.ops.get(handle[0].op)
        if op is None:
            raise RemoteError("PermissionError", f"{handle[0].op!r} is not a payload operation")
        with self.lock:
            return op(self.target, request)


class CommandTarget:
    """What a host runs for a command service: the resource, built where the host runs it, served over the
    server side of a request/reply transport (and, where its bulk payloads take their own transport, the
    fixed-layout operations over that one, on a second thread).

    Args:
        build: picklable callable returning the resource, ready (released by its ``close()``, or by the
            ``shutdown()`` of an owner).
        server_side: what the serving side of the transport needs (its ``server()`` gives the endpoint).
        allowed: the client operations.
        payload_side: the serving side of a payload transport, or ``None``.
        payload_ops: operation name -> ``fn(resource, request TensorDict) -> answer TensorDict``.
    """

    def __init__(self, build: Callable[[], Any], server_side: Any, allowed: Allowed, payload_side: Any = None,
                 payload_ops: Mapping[str, Callable] | None = None):
        self.resource = build()
        lock = threading.Lock() if payload_side is not None else None
        self.loop = CommandLoop(self.resource, server_side.server(), allowed, lock)
        self.payload = None if payload_side is None else PayloadLoop(self.resource, payload_side.server(),
                                                                     dict(payload_ops or {}), lock)

    def serve(self, stop: threading.Event) -> None:
        """Serve commands (and payload operations, on a second thread) until ``stop`` is set."""
        if self.payload is None:
            self.loop.run(stop)
            return
        thread = threading.Thread(target=self.payload.run, args=(stop,), name="payload", daemon=True)
        thread.start()
        try:
            self.loop.run(stop)
        finally:
            stop.set()
            thread.join()

    def close(self) -> None:
        """Release the resource: its ``close()``, or the ``shutdown()`` of an owner served in its host's caller."""
        # a plain resource closes; a twin owner (a logger placed in its host's caller) shuts down
        release = getattr(self.resource, "close", None) or self.resource.shutdown
        release()


class CommandClient:
    """Base of command clients: ``_call(method, *args, **kwargs)`` is one acknowledged round trip.

    Picklable along the rules of its transport; it has no lifecycle methods.
    """

    def __init__(self, endpoint: Any):
        self._endpoint = endpoint

    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return self._endpoint.submit((method, args, kwargs)).result()
