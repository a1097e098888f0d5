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

- the owner's method raised: `RemoteError` with the remote type, message and traceback text (our own
  `ServiceError` subclasses keep their type);
- the actor died (``kill -9``, node loss, an error while constructing it): `PeerFailureError`;
- no answer within the caller's timeout: `ServiceTimeoutError`.

Ray is imported lazily (the ``ray`` extra), always after ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` is set, which
together with ``_node_ip_address="127.0.0.1"`` keeps a local cluster on loopback.
"""

from __future__ import annotations

import os
from typing import Any

from .actor_calls import ActorCallTransport, ProducerClient, submit_in_order
from .descriptor import RAY
from .kernel.errors import (ConfigurationError, PeerFailureError, RemoteError, ServiceError, ServiceTimeoutError,
                            qualified_name)


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
            return RemoteError(qualified_name(type(cause)), str(cause), str(exc))
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
        """Whether the answer (or the actor's death) has arrived, without waiting."""
        return self.ready(0)

    def ready(self, timeout: float) -> bool:
        """Whether the answer (or the actor's death) arrived within ``timeout`` seconds."""
        ready, _ = import_ray().wait([self.ref], timeout=timeout)
        return bool(ready)

    def result(self, timeout: float | None = None) -> Any:
        """Wait for the answer and return it.

        Raises:
            PeerFailureError: the actor died.
            ServiceTimeoutError: no answer within ``timeout`` seconds.
        """
        return get(self.ref, self.what, timeout)


def remote(handle: Any, method: str, args: tuple, what: str) -> RayFuture:
    """Call ``method`` of an actor without waiting; the future raises our errors (as does a refused call)."""
    try:
        ref = getattr(handle, method).remote(*args)
    except Exception as exc:  # noqa: BLE001 - e.g. the actor is known dead already
        raise translate(exc, what) from None
    return RayFuture(ref, what)


# ---------------------------------------------------------------------------------------------- transport
DELIVER = "deliver"
"""The method every hosting actor offers: ``deliver(endpoint_id, message)`` hands a request to the server
endpoint of that id inside the actor and returns its answer; ``message`` is ``(producer, sequence, payload)``."""


def deliver(endpoint_id: str, message: tuple) -> Any:
    """Inside the actor: hand a request to the server endpoint ``endpoint_id`` in its producer's order and wait for
    its answer."""
    return submit_in_order(endpoint_id, message).result()


def _restarted() -> bool:
    """Whether this process is an actor that Ray restarted (its callers are mid-sequence)."""
    try:
        return bool(import_ray().get_runtime_context().was_current_actor_reconstructed)
    except Exception:  # noqa: BLE001 - not in an actor (a test serving in-process): a fresh start
        return False


class RayTransport(ActorCallTransport):
    """Request/reply over calls to the actor that hosts the server (see `ActorCallTransport`).

    Args:
        name: names the endpoint in messages (``inference``, ``replay``...).
        max_queue_size: most requests waiting inside the actor.
    """

    descriptor = RAY

    def _first_seen(self) -> bool:
        return _restarted()

    def _client(self) -> "RayClient":
        return RayClient(self.handle, self.endpoint_id, self.name)


class RayClient(ProducerClient):
    """The client endpoint of a `RayTransport`: ``submit(payload)`` is one actor call, its answer a
    `RayFuture`. Picklable anywhere in the cluster (it holds the actor handle)."""

    __slots__ = ()

    def _deliver(self, args: tuple, what: str) -> RayFuture:
        return remote(self.handle, DELIVER, args, what)
