"""``thread``: clients and a server thread in one process, over a bounded queue and one future per request.

Rules: the server runs in the clients' process; a client pickled and unpickled inside that process works,
anywhere else it raises `PeerFailureError`. Any TensorDict may travel (no fixed
layout). ``max_queue_size`` bounds pending requests: producers block when it is full.
"""

from __future__ import annotations

import queue
import time

from tensordict import TensorDictBase

from . import local as _local
from .base import Batch, RequestReplyTransport, ServerEndpoint, drain
from .descriptor import THREAD, ThreadOptions
from .kernel.errors import PeerFailureError


class ThreadTransport(RequestReplyTransport):
    """In-process request/reply over ``queue.Queue``.

    Args:
        max_queue_size: most pending requests before producers block.
        name: the component served (kept for messages).

    Examples:
        >>> transport = ThreadTransport()
        >>> client = transport.client()   # hand to actor threads
    """

    descriptor = THREAD

    def __init__(self, max_queue_size: int = ThreadOptions.max_queue_size, name: str = "service"):
        super().__init__()
        self.options = ThreadOptions(max_queue_size)
        self.max_queue_size, self.name = max_queue_size, name
        self.queue: queue.Queue = queue.Queue(max_queue_size)
        self.status = _local.LocalStatus()
        self._id = _local.register(self)

    def client(self) -> "ThreadClient":
        return ThreadClient(self._id)

    def server(self) -> "ThreadServer":
        return ThreadServer(self)

    def mark_serving(self, pid: int) -> None:
        self.status.reason = None

    def mark_dead(self, *, stopped: bool) -> None:
        with self.status.lock:
            self.status.reason = "the server was shut down" if stopped else "the server thread died"
        _drain(self.queue, self.status.reason)

    def _close(self) -> None:
        self.mark_dead(stopped=True)


def _drain(q: queue.Queue, reason: str) -> None:
    while True:
        try:
            _, future, _ = q.get_nowait()
        except queue.Empty:
            return
        future.set_exception(PeerFailureError(reason))


class ThreadClient:
    """The client of a `ThreadTransport`: ``submit(td)`` returns a future."""

    def __init__(self, transport_id: tuple[int, int]):
        self._id = transport_id
        self._transport = _local.lookup(*transport_id, "thread")

    def __reduce__(self):
        return (ThreadClient, (self._id,))

    def submit(self, td: TensorDictBase) -> _local.LocalFuture:
        """Queue ``td`` for the server thread; waits while the queue is full.

        Returns:
            The future of the answer.

        Raises:
            PeerFailureError: the server is gone.
        """
        transport = self._transport
        future = _local.LocalFuture()
        item = (td, future, time.monotonic())
        while True:
            with transport.status.lock:
                if transport.status.reason is not None:
                    raise PeerFailureError(transport.status.reason)
                try:
                    transport.queue.put_nowait(item)
                    return future
                except queue.Full:
                    pass
            time.sleep(0.0005)  # backpressure: the queue is full


class ThreadServer(ServerEndpoint):
    """The serving end of `ThreadTransport`: drains the queue into batches."""

    def __init__(self, transport: ThreadTransport):
        self.transport = transport
        self.queue = transport.queue

    def collect(self, max_n: int, min_n: int, timeout: float, poll: float) -> Batch | None:
        items = drain(self.queue, max_n, min_n, timeout, poll)
        if not items:
            return None
        return Batch(handles=[f for _, f, _ in items], requests=[td for td, _, _ in items], enqueued=[t for _, _, t in items])

    def reply(self, batch: Batch, out: TensorDictBase) -> None:
        for i, future in enumerate(batch.handles):
            future.set_result(out[i])

    def fail(self, batch: Batch, error: BaseException) -> None:
        for future in batch.handles:
            future.set_exception(error)

    def close(self, reason: str = "the server was shut down") -> None:
        self.transport.mark_dead(stopped=True)
