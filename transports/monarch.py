"""``monarch``: requests travel as endpoint calls to the Monarch actor that hosts the server.

Rules: the owner lives in a Monarch actor (placement ``monarch``); clients hold the actor's reference, so they are
picklable into other Monarch actors (collectors, the learner's process). Any picklable payload may travel. The actor
answers through an explicit response port from the server's thread, so it keeps taking calls while earlier ones
wait to be batched (what happens inside the actor: `transports.actor_calls`). What a client raises is our error
hierarchy: the owner's error as `RemoteError` (our own `ServiceError` subclasses keep their type); a
dead actor or process as `PeerFailureError`, within 0.1 s where the process is on this machine (Monarch
itself reports a killed process after several seconds); no answer in time as `ServiceTimeoutError`.

Monarch (the ``monarch`` extra, ``torchmonarch``) is imported only when a Monarch owner starts.
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass
from typing import Any, Callable

from .actor_calls import ActorCallTransport, ProducerClient
from .descriptor import MONARCH
from .peers import pid_runs
from .kernel.errors import (ConfigurationError, PeerFailureError, RemoteError, ServiceError, ServiceTimeoutError,
                            qualified_name)

POLL_S = 0.1
"""How often a waiting caller checks that the actor's process still runs."""


def import_monarch():
    """``monarch.actor``; a clear error when the extra is missing."""
    try:
        import monarch.actor as actor
    except ImportError as exc:  # pragma: no cover - depends on the installation
        raise ConfigurationError("placement 'monarch' needs Monarch: pip install 'rl-services-launcher[monarch]'",
                                 path="service") from exc
    return actor


@dataclass(frozen=True)
class ActorRef:
    """What a client needs of a hosting actor: the actor, and where its process runs (to notice its death)."""

    actor: Any
    pid: int
    hostname: str

    def runs(self) -> bool:
        """Whether the actor's process runs (checked by pid on its machine; elsewhere Monarch alone tells)."""
        return self.hostname != socket.gethostname() or pid_runs(self.pid)


def translate(exc: BaseException, what: str, ref: ActorRef | None = None) -> BaseException:
    """Our error for what a Monarch call raised: ours as they are (the actor sends them through its port)."""
    if isinstance(exc, ServiceError):
        return exc
    if isinstance(exc, TimeoutError):
        return ServiceTimeoutError(f"{what}: no answer in time (the actor is alive)")
    if type(exc).__name__ == "SupervisionError" or (ref is not None and not ref.runs()):
        return PeerFailureError(f"{what}: the Monarch actor died ({str(exc).splitlines()[0][:300]})")
    return RemoteError(qualified_name(type(exc)), str(exc))


class MonarchFuture:
    """The answer to one Monarch call: ``result(timeout)``, ``done()`` and ``ready(timeout)``; while it waits, the
    actor's process is watched."""

    __slots__ = ("future", "what", "ref", "on_death")

    def __init__(self, future: Any, what: str, ref: ActorRef, on_death: Callable[[], str] | None = None):
        self.future, self.what, self.ref, self.on_death = future, what, ref, on_death

    def done(self) -> bool:
        """Whether the answer (or the actor's death) has arrived, without waiting."""
        return self.ready(0)

    def ready(self, timeout: float) -> bool:
        """Whether the answer (or the actor's death) arrived within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.future.get(timeout=min(POLL_S, max(0.0, deadline - time.monotonic())) or 1e-3)
                return True
            except TimeoutError:
                if not self.ref.runs():
                    return True
            except Exception:  # noqa: BLE001 - an error is an answer
                return True
            if time.monotonic() >= deadline:
                return False

    def result(self, timeout: float | None = None) -> Any:
        """Wait for the answer and return it, watching the actor's process meanwhile.

        Args:
            timeout: most seconds to wait; ``None`` waits as long as the actor lives.

        Raises:
            PeerFailureError: the actor died.
            ServiceTimeoutError: no answer within ``timeout`` while the actor lives.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            step = POLL_S if deadline is None else max(1e-3, min(POLL_S, deadline - time.monotonic()))
            try:
                return self.future.get(timeout=step)
            except TimeoutError:
                if not self.ref.runs():
                    reason = self.on_death() if self.on_death is not None else "its process ended"
                    raise PeerFailureError(f"{self.what}: the Monarch actor died ({reason})") from None
                if deadline is not None and time.monotonic() >= deadline:
                    raise ServiceTimeoutError(
                        f"{self.what}: no answer within {timeout} s (the actor is alive)") from None
            except Exception as exc:  # noqa: BLE001 - translated
                raise translate(exc, self.what, self.ref) from None


def call(ref: ActorRef, method: str, args: tuple, what: str) -> MonarchFuture:
    """Call endpoint ``method`` of the actor without waiting; the future raises our errors."""
    if not ref.runs():
        raise PeerFailureError(f"{what}: the Monarch actor died (its process ended)")
    try:
        future = getattr(ref.actor, method).call_one(*args)
    except Exception as exc:  # noqa: BLE001 - e.g. the actor is known dead already
        raise translate(exc, what, ref) from None
    return MonarchFuture(future, what, ref)


class MonarchTransport(ActorCallTransport):
    """Request/reply over endpoint calls to the Monarch actor that hosts the server.

    Args:
        name: names the endpoint in messages (``inference``, ``replay``...).
        max_queue_size: most requests waiting inside the actor.
    """

    descriptor = MONARCH

    def _client(self) -> "MonarchClient":
        return MonarchClient(self.handle, self.endpoint_id, self.name)


class MonarchClient(ProducerClient):
    """The client endpoint of a `MonarchTransport`: ``submit(payload)`` is one endpoint call, its answer a
    `MonarchFuture` (``handle`` is the actor's `ActorRef`)."""

    __slots__ = ()

    def _deliver(self, args: tuple, what: str) -> MonarchFuture:
        return call(self.handle, "deliver", args, what)
