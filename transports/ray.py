"""``ray``: requests travel as Ray actor calls to the actor that hosts the server; answers come back through
the object store.

Rules: the owner lives in a Ray actor (placement ``ray``). Clients hold the actor handle, so they are picklable
to any process connected to the cluster (drivers, Ray tasks and actors). Any picklable payload may travel.
Inside the actor, requests land in an in-process queue that the server endpoint drains, so concurrent calls
are served in batches exactly as on a thread (the actor takes as many calls at once as its concurrency allows).
An actor that takes several calls at once runs them in no guaranteed order, so each client copy is a producer
that numbers its requests, and the actor puts each producer's requests into the queue in that order (a request
that arrives early waits for its predecessors; requests of different producers never wait for each other).
What a client raises is our error hierarchy, never a raw Ray exception:

- the owner's method raised: :class:`RemoteError` with the remote type, message and traceback text (our own
  :class:`ServiceError` subclasses keep their type);
- the actor died (``kill -9``, node loss, an error while constructing it): :class:`PeerFailureError`;
- no answer within the caller's timeout: :class:`ServiceTimeoutError`.

Ray is imported lazily (the ``ray`` extra), always after ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` is set, which
together with ``_node_ip_address="127.0.0.1"`` keeps a local cluster on loopback.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from typing import Any

from .base import RequestReplyTransport
from .errors import ConfigurationError, PeerFailureError, RemoteError, ServiceError, ServiceTimeoutError, TransportError


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
    """The answer to one Ray call: ``result(timeout)``, ``done()`` and ``ready(timeout)``."""

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


def remote(handle: Any, method: str, args: tuple, what: str) -> RayFuture:
    """Call ``method`` of an actor without waiting; the future raises our errors (as does a refused call)."""
    try:
        ref = getattr(handle, method).remote(*args)
    except Exception as exc:  # noqa: BLE001 - e.g. the actor is known dead already
        raise translate(exc, what) from None
    return RayFuture(ref, what)


# ---------------------------------------------------------------------------------------------- transport
_ids = itertools.count(1)
_ENDPOINTS: dict[str, tuple[Any, "Sequencer"]] = {}  # endpoint id -> (a client of the in-actor queue, its order)
_ENDPOINTS_LOCK = threading.Lock()

DELIVER = "deliver"
"""The method every hosting actor offers: ``deliver(endpoint_id, message)`` hands a request to the server
endpoint of that id inside the actor and returns its answer; ``message`` is ``(producer, sequence, payload)``."""

GAP_TIMEOUT = 5.0
"""Most seconds a request waits inside the actor for an earlier request of its producer that has not arrived (a
safety valve: such a request was lost with a restarted actor; past it, order gives way to progress)."""


class Sequencer:
    """Releases each producer's requests in the order of their sequence numbers (0, 1, 2... per producer).

    Args:
        first_seen: whether a producer's first request seen here starts its sequence (an actor Ray restarted meets
            producers mid-sequence); otherwise every producer starts at 0.
    """

    def __init__(self, first_seen: bool = False):
        self.first_seen = first_seen
        self._next: dict[bytes, int] = {}  # producer -> the sequence number it releases next
        self._cond = threading.Condition()

    def release(self, producer: bytes, seq: int, submit: Any) -> Any:
        """Call ``submit()`` once every earlier request of ``producer`` was released; returns what it returns."""
        start = seq if self.first_seen else 0
        with self._cond:
            expected = self._next.get(producer, start)
            if seq > expected:
                deadline = time.monotonic() + GAP_TIMEOUT
                while seq > expected and (left := deadline - time.monotonic()) > 0:
                    self._cond.wait(left)
                    expected = self._next.get(producer, start)
            try:
                return submit()  # under the lock: the order of release is the order in the queue
            finally:
                self._next[producer] = max(expected, seq + 1)  # a failed submit fails its caller, not the successors
                if seq >= expected:
                    self._cond.notify_all()


def deliver(endpoint_id: str, message: tuple) -> Any:
    """Inside the actor: hand a request to the server endpoint ``endpoint_id`` in its producer's order and wait for
    its answer."""
    producer, seq, payload = message
    with _ENDPOINTS_LOCK:
        entry = _ENDPOINTS.get(endpoint_id)
    if entry is None:
        raise TransportError(f"no server endpoint {endpoint_id!r} in this actor (it was shut down)")
    client, sequencer = entry
    return sequencer.release(producer, seq, lambda: client.submit(payload)).result()


def _restarted() -> bool:
    """Whether this process is an actor that Ray restarted (its callers are mid-sequence)."""
    try:
        return bool(import_ray().get_runtime_context().was_current_actor_reconstructed)
    except Exception:  # noqa: BLE001 - not in an actor (a test serving in-process): a fresh start
        return False


class RayTransport(RequestReplyTransport):
    """Request/reply over calls to the actor that hosts the server.

    Built on the owner's side and handed to the actor inside the target's factory; in the actor,
    :meth:`server` returns an endpoint over an in-actor queue. :meth:`bind` records the actor's handle once the
    host started it, and :meth:`client` hands out endpoints over that handle.

    Args:
        name: names the endpoint in messages (``inference``, ``replay``...).
        max_queue_size: most requests waiting inside the actor.
    """

    kind = "ray"
    cross_process = True

    def __init__(self, name: str = "service", max_queue_size: int = 1024):
        super().__init__()
        self.name, self.max_queue_size = name, max_queue_size
        self.endpoint_id = f"{os.getpid()}-{next(_ids)}-{os.urandom(3).hex()}"
        self.handle: Any = None
        self._inner = None  # in the actor: the thread transport the server endpoint drains

    def __getstate__(self):
        return {"name": self.name, "max_queue_size": self.max_queue_size, "endpoint_id": self.endpoint_id}

    def __setstate__(self, state):
        RequestReplyTransport.__init__(self)
        self.__dict__.update(state)
        self.handle, self._inner = None, None

    def server(self):
        from .thread import ThreadTransport

        self._inner = ThreadTransport(max_queue_size=self.max_queue_size)
        self._inner.mark_serving(os.getpid())
        sequencer = Sequencer(first_seen=_restarted())
        with _ENDPOINTS_LOCK:
            _ENDPOINTS[self.endpoint_id] = (self._inner.client(), sequencer)
        return self._inner.server()

    def bind(self, host: Any) -> None:
        self.handle = host.handle

    def client(self) -> "RayClient":
        if self.handle is None:
            raise TransportError(f"the {self.name} Ray endpoint has no actor yet: start its owner first")
        return RayClient(self.handle, self.endpoint_id, self.name)

    def mark_dead(self, *, stopped: bool) -> None:
        if self._inner is not None:
            self._inner.mark_dead(stopped=stopped)

    def _close(self) -> None:
        if self._inner is not None:
            with _ENDPOINTS_LOCK:
                _ENDPOINTS.pop(self.endpoint_id, None)
            self._inner.close()


class RayClient:
    """The client endpoint of a :class:`RayTransport`: ``submit(payload)`` is one actor call. Picklable anywhere
    in the cluster (it holds the actor handle); each copy is a producer of its own, whose requests are served in
    the order it submitted them."""

    __slots__ = ("handle", "endpoint_id", "name", "_producer", "_seq", "_lock")

    def __init__(self, handle: Any, endpoint_id: str, name: str):
        self.handle, self.endpoint_id, self.name = handle, endpoint_id, name
        self._producer = os.urandom(8)
        self._seq = 0
        self._lock = threading.Lock()

    def __reduce__(self):
        return (RayClient, (self.handle, self.endpoint_id, self.name))

    def submit(self, payload: Any) -> RayFuture:
        what = f"{self.name} {payload[0]!r}" if isinstance(payload, tuple) and payload and isinstance(payload[0], str) \
            else f"{self.name} request"
        with self._lock:  # numbered and sent together: a number is used only by a request that was sent
            future = remote(self.handle, DELIVER, (self.endpoint_id, (self._producer, self._seq, payload)), what)
            self._seq += 1
        return future
