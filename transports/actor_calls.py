"""Requests that travel as calls to the actor hosting the server (``ray``, ``monarch``): what happens inside it.

A hosting actor offers one method, ``deliver(endpoint_id, (producer, sequence, payload))``. Inside the actor each
server endpoint is an in-process queue that the server drains, so concurrent calls are served in batches exactly as
on a thread. An actor that takes several calls at once runs them in no guaranteed order, so each client copy is a
producer that numbers its requests, and the actor puts each producer's requests into the queue in that order (a
request that arrives early waits for its predecessors; requests of different producers never wait for each other).
The placements differ only in how a client calls the actor (`ActorCallTransport` subclasses).
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from typing import Any

from .base import RequestReplyTransport
from .descriptor import ActorCallOptions
from .kernel.errors import TransportError

_ids = itertools.count(1)
_ENDPOINTS: dict[str, tuple[Any, "Sequencer"]] = {}  # endpoint id -> (a client of the in-actor queue, its order)
_ENDPOINTS_LOCK = threading.Lock()

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


def submit_in_order(endpoint_id: str, message: tuple) -> Any:
    """Inside the actor: hand a request to the server endpoint ``endpoint_id`` in its producer's order; returns the
    future of its answer."""
    producer, seq, payload = message
    with _ENDPOINTS_LOCK:
        entry = _ENDPOINTS.get(endpoint_id)
    if entry is None:
        raise TransportError(f"no server endpoint {endpoint_id!r} in this actor (it was shut down)")
    client, sequencer = entry
    return sequencer.release(producer, seq, lambda: client.submit(payload))


class ActorCallTransport(RequestReplyTransport):
    """Request/reply over calls to the actor that hosts the server.

    Built on the owner's side and handed to the actor inside the target's factory; in the actor, `server`
    returns an endpoint over an in-actor queue. `bind` records the host's actor handle once the host started
    it, and `client` hands out endpoints over that handle (a subclass says how they call it: `_client`).

    Args:
        name: names the endpoint in messages (``inference``, ``replay``...).
        max_queue_size: most requests waiting inside the actor.
    """

    def __init__(self, name: str = "service", max_queue_size: int = ActorCallOptions.max_queue_size):
        super().__init__()
        self.name, self.max_queue_size = name, max_queue_size
        self.options = ActorCallOptions(max_queue_size)
        self.endpoint_id = f"{os.getpid()}-{next(_ids)}-{os.urandom(3).hex()}"
        self.handle: Any = None
        self._inner = None  # in the actor: the thread transport the server endpoint drains

    def __getstate__(self):
        return {"name": self.name, "max_queue_size": self.max_queue_size, "endpoint_id": self.endpoint_id}

    def __setstate__(self, state):
        RequestReplyTransport.__init__(self)
        self.__dict__.update(state)
        self.handle, self._inner = None, None
        self.options = ActorCallOptions(self.max_queue_size)

    def _first_seen(self) -> bool:
        """Whether producers may be met mid-sequence here (an actor restarted by its placement)."""
        return False

    def server(self):
        from .thread import ThreadTransport

        self._inner = ThreadTransport(max_queue_size=self.max_queue_size)
        self._inner.mark_serving(os.getpid())
        with _ENDPOINTS_LOCK:
            _ENDPOINTS[self.endpoint_id] = (self._inner.client(), Sequencer(first_seen=self._first_seen()))
        return self._inner.server()

    def bind(self, host: Any) -> None:
        self.handle = host.handle

    def client(self) -> Any:
        if self.handle is None:
            raise TransportError(f"the {self.name} {self.kind} endpoint has no actor yet: start its owner first")
        return self._client()

    def _client(self) -> Any:
        raise NotImplementedError

    def mark_dead(self, *, stopped: bool) -> None:
        if self._inner is not None:
            self._inner.mark_dead(stopped=stopped)

    def _close(self) -> None:
        if self._inner is not None:
            with _ENDPOINTS_LOCK:
                _ENDPOINTS.pop(self.endpoint_id, None)
            self._inner.close()


class ProducerClient:
    """A client endpoint of an `ActorCallTransport`: ``submit(payload)`` is one call of the actor's
    ``deliver``. Each copy is a producer of its own, whose requests are served in the order it submitted them; a
    subclass says how it calls the actor (`_deliver`)."""

    __slots__ = ("handle", "endpoint_id", "name", "_producer", "_seq", "_lock")

    def __init__(self, handle: Any, endpoint_id: str, name: str):
        self.handle, self.endpoint_id, self.name = handle, endpoint_id, name
        self._producer = os.urandom(8)
        self._seq = 0
        self._lock = threading.Lock()

    def __reduce__(self):
        return (type(self), (self.handle, self.endpoint_id, self.name))

    def submit(self, payload: Any) -> Any:
        """Send ``payload`` to the actor as this producer's next request.

        Returns:
            The placement's future of the answer (what `_deliver` returns).
        """
        what = f"{self.name} {payload[0]!r}" if isinstance(payload, tuple) and payload and isinstance(payload[0], str) \
            else f"{self.name} request"
        with self._lock:  # numbered and sent together: a number is used only by a request that was sent
            future = self._deliver((self.endpoint_id, (self._producer, self._seq, payload)), what)
            self._seq += 1
        return future

    def _deliver(self, args: tuple, what: str) -> Any:
        raise NotImplementedError
