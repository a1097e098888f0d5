"""``shared_memory``: preallocated request/response slots in shared memory; only slot states move.

Rules: fixed layouts (CPU tensors only, declared up front; extra keys are not sent, a missing key or a wrong
shape or dtype raises `LayoutError` in the caller). Any client may use any free
slot; ``num_slots`` bounds the requests in flight and so gives backpressure. Clients pickle to any process of
this machine (segments and semaphores reattach by name), and any number of processes may share one. Read every future you submit:
its slot is free again only once its answer is read.
"""

from __future__ import annotations

from tensordict import TensorDictBase

from .._shared import wait_for
from .control import CLAIMED, FREE
from .transport import SlotClientBase, SlotFuture, SlotTransport
from ..descriptor import SHARED_MEMORY, SlotOptions
from ..kernel.errors import TransportError
from ..sync import Lock, Semaphore


class SharedMemoryTransport(SlotTransport):
    """Fixed-layout request/reply over a shared-memory slot bank.

    Args:
        request_layout: layout of one request (a `Layout` or a representative TensorDict).
        response_layout: layout of one response.
        num_slots: requests in flight at most, over all clients.
        context: multiprocessing start method of the processes involved.
        name: the component served, named in its clients' errors.
    """

    descriptor = SHARED_MEMORY

    def __init__(self, request_layout, response_layout, num_slots: int = SlotOptions.num_slots,
                 context: str = SlotOptions.context, name: str = "service"):
        super().__init__(request_layout, response_layout, num_slots, context, name)
        self.free = Semaphore(num_slots, context)
        self.claim_lock = Lock(context)

    def client(self) -> "SharedMemoryClient":
        return SharedMemoryClient({**self.shared(), "free": self.free, "claim_lock": self.claim_lock})


class SharedMemoryClient(SlotClientBase):
    """Claims a free slot per request; many requests may be in flight."""

    def __init__(self, shared: dict):
        super().__init__(shared)
        self.free, self.claim_lock = shared["free"], shared["claim_lock"]

    def submit(self, td: TensorDictBase) -> SlotFuture:
        """Claim a free slot (waiting for one when all are in flight) and write ``td`` into it.

        Returns:
            The future of the answer.

        Raises:
            LayoutError: ``td`` does not match the request layout.
            PeerFailureError: the server is gone.
        """
        values = self._validate(td)
        if not self.free.acquire(False):  # a free slot is the common case: skip the waiting loop's set-up
            wait_for(lambda step: self.free.acquire(timeout=step), self.status, None, "waiting for a free slot")
        state = self.control.state
        with self.claim_lock:
            # Holding a ``free`` permit means a FREE slot exists (a slot is FREE before its permit is released);
            # FREE is the lowest state, so argmin finds the first one.
            slot = int(state.argmin())
            if state[slot] != FREE:
                raise TransportError("no free slot although one was promised; the slot states are corrupt")
            state[slot] = CLAIMED
        self._write(slot, values)
        return SlotFuture(self, slot)

    def _release(self, slot: int) -> None:
        self.control.state[slot] = FREE
        self.free.release()
