"""``ray``: requests travel as Ray actor calls to the actor that hosts the server; answers come back through
the object store.

Rules: the owner lives in a Ray actor (placement ``ray``). Clients hold the actor handle, so they are picklable
to any process connected to the cluster (drivers, Ray tasks and actors). Any picklable payload may travel.
Inside the actor, requests land in an in-process queue that the server endpoint drains, so concurrent calls
are served in batches exactly as on a thread (the actor takes as many calls at once as its concurrency allows).
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
_ENDPOINTS: dict[str, Any] = {}  # endpoint id -> a client of the in-actor queue (in the actor's process)
_ENDPOINTS_LOCK = threading.Lock()

DELIVER = "deliver"
"""The method every hosting actor offers: ``deliver(endpoint_id, payload)`` hands a request to the server
endpoint of that id inside the actor and returns its answer."""


def deliver(endpoint_id: str, payload: Any) -> Any:
    """Inside the actor: hand ``payload`` to the server endpoint ``endpoint_id`` and wait for its answer."""
    with _ENDPOINTS_LOCK:
        client = _ENDPOINTS.get(endpoint_id)
    if client is None:
        raise TransportError(f"no server endpoint {endpoint_id!r} in this actor (it was shut down)")
    return client.submit(payload).result()


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
        with _ENDPOINTS_LOCK:
            _ENDPOINTS[self.endpoint_id] = self._inner.client()
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
    in the cluster (it holds the actor handle)."""

    __slots__ = ("handle", "endpoint_id", "name")

    def __init__(self, handle: Any, endpoint_id: str, name: str):
        self.handle, self.endpoint_id, self.name = handle, endpoint_id, name

    def __reduce__(self):
        return (RayClient, (self.handle, self.endpoint_id, self.name))

    def submit(self, payload: Any) -> RayFuture:
        what = f"{self.name} {payload[0]!r}" if isinstance(payload, tuple) and payload and isinstance(payload[0], str) \
            else f"{self.name} request"
        return remote(self.handle, DELIVER, (self.endpoint_id, payload), what)
