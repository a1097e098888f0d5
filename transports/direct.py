"""``direct`` for a server thread: one slot per client, no shared request queue.

Each client owns a slot holding at most one request in flight; submitting while the previous request is
unanswered waits for it. The server sweeps every slot with a request (in order of submission) into one batch.
Rules as for ``thread``: one process only. (An owner placed ``direct`` needs no transport at all: its client
is the owner.)
"""

from __future__ import annotations

import threading
import time

from tensordict import TensorDictBase

from . import local as _local
from .base import Batch, RequestReplyTransport, ServerEndpoint
from .descriptor import DIRECT, DirectOptions
from .kernel.errors import PeerFailureError


class _Slot:
    __slots__ = ("request", "future", "enqueued", "free")

    def __init__(self) -> None:
        self.request = None
        self.future = None
        self.enqueued = 0.0
        self.free = threading.Event()
        self.free.set()


class DirectSlotTransport(RequestReplyTransport):
    """Per-client slots swept by a server thread in the same process.

    Args:
        name: the component served (kept for messages).
    """

    descriptor = DIRECT

    def __init__(self, name: str = "service") -> None:
        super().__init__()
        self.options, self.name = DirectOptions(), name
        self.slots: list[_Slot] = []
        self.pending: list[_Slot] = []
        self.cond = threading.Condition()
        self.status = _local.LocalStatus()
        self._id = _local.register(self)

    def client(self) -> "DirectSlotClient":
        with self.cond:
            self.slots.append(_Slot())
            index = len(self.slots) - 1
        return DirectSlotClient(self._id, index)

    def server(self) -> "DirectSlotServer":
        return DirectSlotServer(self)

    def mark_serving(self, pid: int) -> None:
        self.status.reason = None

    def mark_dead(self, *, stopped: bool) -> None:
        with self.cond:
            self.status.reason = "the server was shut down" if stopped else "the server thread died"
            pending, self.pending = self.pending, []
        for slot in pending:
            _finish(slot, error=PeerFailureError(self.status.reason))

    def _close(self) -> None:
        self.mark_dead(stopped=True)


def _finish(slot: _Slot, result=None, error: BaseException | None = None) -> None:
    future, slot.future, slot.request = slot.future, None, None
    slot.free.set()
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


class DirectSlotClient:
    """A client endpoint of `DirectSlotTransport`: one slot, at most one request in flight.

    Pickles as a reference to the transport in this process (it cannot leave the process).
    """

    def __init__(self, transport_id: tuple[int, int], index: int):
        self._id, self._index = transport_id, index
        self._transport = _local.lookup(*transport_id, "direct")
        self._slot = self._transport.slots[index]

    def __reduce__(self):
        return (DirectSlotClient, (self._id, self._index))

    def submit(self, td: TensorDictBase) -> _local.LocalFuture:
        """Put ``td`` in this client's slot; waits while the previous request is unanswered.

        Returns:
            The future of the answer.

        Raises:
            PeerFailureError: the server is gone.
        """
        transport, slot = self._transport, self._slot
        while not slot.free.wait(0.1):  # one request in flight per client
            if transport.status.reason is not None:
                raise PeerFailureError(transport.status.reason)
        future = _local.LocalFuture()
        with transport.cond:
            if transport.status.reason is not None:
                raise PeerFailureError(transport.status.reason)
            slot.free.clear()
            slot.request, slot.future, slot.enqueued = td, future, time.monotonic()
            transport.pending.append(slot)
            transport.cond.notify()
        return future


class DirectSlotServer(ServerEndpoint):
    """The serving end of `DirectSlotTransport`: sweeps the filled slots into batches."""

    def __init__(self, transport: DirectSlotTransport):
        self.transport = transport

    def collect(self, max_n: int, min_n: int, timeout: float, poll: float) -> Batch | None:
        t = self.transport
        with t.cond:
            if not t.pending and not t.cond.wait(poll):
                return None
            deadline = time.monotonic() + timeout
            while len(t.pending) < min_n:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not t.cond.wait(remaining):
                    break
            taken, t.pending = t.pending[:max_n], t.pending[max_n:]
        if not taken:
            return None
        return Batch(handles=taken, requests=[s.request for s in taken], enqueued=[s.enqueued for s in taken])

    def reply(self, batch: Batch, out: TensorDictBase) -> None:
        for i, slot in enumerate(batch.handles):
            _finish(slot, result=out[i])

    def fail(self, batch: Batch, error: BaseException) -> None:
        for slot in batch.handles:
            _finish(slot, error=error)

    def close(self, reason: str = "the server was shut down") -> None:
        self.transport.mark_dead(stopped=True)
