"""``process_slot``: one fixed shared-memory slot per worker process, a doorbell, batched sweeps.

Rules: fixed layouts (CPU tensors only); each client endpoint owns one slot and carries one request at a
time (read the answer before submitting again), which fits one synchronous acting loop per environment
worker. Create one client per worker (each pickles to any process of this machine; a copy used in a second live
process is refused at its call site). The
server gathers every ready slot in one pass and scatters the answers in one pass.
"""

from __future__ import annotations

from tensordict import TensorDictBase

from .._shared import EndpointClaims
from .control import FREE
from .transport import SlotClientBase, SlotFuture, SlotTransport
from ..descriptor import PROCESS_SLOT, SlotOptions
from ..kernel.errors import PeerFailureError, TransportError
from ..sync import Lock


class ProcessSlotTransport(SlotTransport):
    """Fixed-layout request/reply with a dedicated slot per client.

    Args:
        request_layout: layout of one request (a `Layout` or a representative TensorDict).
        response_layout: layout of one response.
        num_slots: client endpoints (workers) this transport can hand out.
        context: multiprocessing start method of the processes involved.
        name: the component served, named in its clients' errors.
    """

    descriptor = PROCESS_SLOT

    def __init__(self, request_layout, response_layout, num_slots: int = SlotOptions.num_slots,
                 context: str = SlotOptions.context, name: str = "service"):
        super().__init__(request_layout, response_layout, num_slots, context, name)
        self.claims = EndpointClaims(num_slots, Lock(context))
        self._next = 0

    def client(self) -> "ProcessSlotClient":
        if self._next >= self.num_slots:
            raise TransportError(f"all {self.num_slots} process slots are taken; raise num_slots")
        slot, self._next = self._next, self._next + 1
        return ProcessSlotClient({**self.shared(), "claims": self.claims}, slot)

    def _close(self) -> None:
        super()._close()
        self.claims.close()


class ProcessSlotClient(SlotClientBase):
    """Owns slot ``slot``: one request in flight at a time."""

    def __init__(self, shared: dict, slot: int):
        super().__init__(shared)
        self.slot, self.claims = slot, shared["claims"]

    def __getstate__(self):
        return (self._shared, self.slot)

    def __setstate__(self, state):
        self.__init__(*state)

    def submit(self, td: TensorDictBase) -> SlotFuture:
        """Write ``td`` into this worker's slot and ring the server's doorbell.

        Returns:
            The future of the answer.

        Raises:
            LayoutError: ``td`` does not match the request layout.
            TransportError: the slot still holds an unanswered request, or another live process holds the slot.
            PeerFailureError: the server is gone.
        """
        values = self._validate(td)
        # a slot serves one worker process: a copy of this client in another live process is refused
        self.claims.claim(self.slot, "process slot")
        if self.control.state[self.slot] != FREE:
            problem = self.status.problem()  # a request left behind by a server that died unseen
            if problem is not None:
                raise PeerFailureError(problem)
            raise TransportError(
                f"process slot {self.slot} still holds a request: read the previous answer before submitting again"
            )
        self._write(self.slot, values)
        return SlotFuture(self, self.slot)

    def _release(self, slot: int) -> None:
        self.control.state[slot] = FREE
