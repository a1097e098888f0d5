"""Slot banks in shared memory with semaphore doorbells: the transport and client under ``shared_memory`` and
``process_slot``.

Requests and responses live in two `SlotBank`s (fixed layouts, tensors only); only slot states and semaphore posts
move between processes. A control block (`transports.slots.control`) holds per slot its state, its submission time
and room for an error text; the serving side is `transports.slots.server`.
"""

from __future__ import annotations

import functools
import time

import numpy as np
import torch
from tensordict import TensorDictBase

from .._shared import AdaptiveSpin, PeerStatus, wait_for
from ..base import RequestReplyTransport, ResponseFuture
from ..descriptor import SlotOptions
from ..kernel.errors import ConfigurationError, PeerFailureError
from ..layout import Layout
from ..segments import SlotBank
from ..sync import Semaphore
from .control import ANSWERED, ERROR_BYTES, FAILED, READY, VERSION_KEY, Control
from .rows import clones, flat, leaves, lookup_key
from .server import SlotServer, SlotServerSide

class SlotTransport(RequestReplyTransport):
    """Base of the fixed-layout slot transports.

    Args:
        request_layout: layout of one request (a `Layout` or a representative TensorDict).
        response_layout: layout of one response.
        num_slots: requests in flight at most.
        context: multiprocessing start method of the processes involved.
        name: the component served, named in its clients' errors.
    """

    def __init__(self, request_layout, response_layout, num_slots: int = SlotOptions.num_slots,
                 context: str = SlotOptions.context, name: str = "service"):
        super().__init__()
        if request_layout is None or response_layout is None:
            raise ConfigurationError(
                f"transport {self.kind!r} needs request and response layouts before the server starts",
                path="transport_options",
            )
        if num_slots < 1:
            raise ConfigurationError(f"num_slots must be >= 1, got {num_slots!r}", path="transport_options.num_slots")
        self.request_layout = _as_layout(request_layout)
        self.response_layout = _as_layout(response_layout)
        _cpu_only(self.request_layout, "request")
        _cpu_only(self.response_layout, "response")
        _stampable(self.response_layout)
        self.num_slots, self.context = num_slots, context
        self.options = SlotOptions(num_slots, context)
        self.requests = SlotBank(self.request_layout, num_slots)
        self.responses = SlotBank(self.response_layout, num_slots)
        self.control = Control(num_slots)
        self.doorbell = Semaphore(0, context)
        self.answered = [Semaphore(0, context) for _ in range(num_slots)]
        self.status = PeerStatus(name=name)

    @classmethod
    def shared_memory_bytes(cls, request_layout, response_layout, options) -> int:
        """The request and response banks and the control block of ``num_slots`` slots."""
        num_slots = int(options.get("num_slots", SlotOptions.num_slots))
        return (SlotBank.nbytes(_as_layout(request_layout), num_slots)
                + SlotBank.nbytes(_as_layout(response_layout), num_slots) + num_slots * (16 + ERROR_BYTES))

    def server(self):
        return SlotServer(self.shared())

    def server_side(self):
        return SlotServerSide(self.shared())

    def mark_serving(self, pid: int) -> None:
        self.status.set_serving(pid)

    def mark_dead(self, *, stopped: bool) -> None:
        self.status.set_dead(stopped)
        for sem in self.answered:  # wake every waiting client now; each then sees the status
            sem.release()

    def _close(self) -> None:
        self.status.set_dead(stopped=True)
        for part in (self.requests, self.responses, self.control, self.status):
            part.close()

    def shared(self) -> dict:
        """The pieces in shared memory that clients and the server attach to (picklable)."""
        return {
            "request_layout": self.request_layout,
            "requests": self.requests,
            "responses": self.responses,
            "control": self.control,
            "doorbell": self.doorbell,
            "answered": self.answered,
            "status": self.status,
        }


def _as_layout(value) -> Layout:
    return value if isinstance(value, Layout) else Layout.from_tensordict(value)


def _stampable(layout: Layout) -> None:
    """The server writes ``policy_version`` into the response slots (see SlotServer.stamps_version): int64, one per
    request, so of the response's batch size."""
    for leaf in layout:
        if leaf.key == VERSION_KEY and (leaf.dtype != torch.int64 or leaf.shape != tuple(layout.batch_size)):
            raise ConfigurationError(
                f"response layout key 'policy_version' is {leaf.describe()}: the server writes it as int64 of shape "
                f"{list(layout.batch_size)} (the response's batch size)",
                path="response_layout",
            )


def _cpu_only(layout: Layout, what: str) -> None:
    for leaf in layout:
        if leaf.device != "cpu":
            raise ConfigurationError(
                f"{what} layout key {'.'.join(leaf.key)!r} is on {leaf.device}: slot transports carry CPU tensors "
                "(the server moves batches to the policy device)",
                path="transport_options",
            )


class SlotClientBase:
    """Shared client logic: write a request into a slot, ring the doorbell, wait for the slot's answer."""

    def __init__(self, shared: dict):
        self._shared = shared
        self.request_layout: Layout = shared["request_layout"]
        self.requests: SlotBank = shared["requests"]
        self.responses: SlotBank = shared["responses"]
        self.control: Control = shared["control"]
        self.doorbell = shared["doorbell"]
        self.answered = shared["answered"]
        self.status: PeerStatus = shared["status"]
        self.spin = AdaptiveSpin()  # this client's own, in its own process
        # Hot-path state, built once: the checks of each request leaf, and per slot the request leaf views and
        # the response TensorDict view (indexing a TensorDict costs more than the whole copy of a small payload).
        # Slot layouts are CPU-only (_cpu_only), so ``is_cpu`` is the device check; a flat key is looked up as a string.
        self._checks = [(lookup_key(leaf.key), torch.Size(leaf.shape), leaf.dtype) for leaf in self.request_layout]
        banks = [self.requests.slots.get(leaf.key) for leaf in self.request_layout]
        self._req_rows = [[bank[slot] for bank in banks] for slot in range(self.requests.num_slots)]
        self._resp_rows = [self.responses.slots[slot] for slot in range(self.responses.num_slots)]
        # A flat response layout answers with clones of the slot's leaf views (see clones); nested keys take the
        # general clone.
        layout = self.responses.layout
        self._resp_leaves = None
        if flat(layout):
            self._resp_size, self._resp_device = torch.Size(layout.batch_size), self._resp_rows[0].device
            self._resp_leaves = [leaves((leaf.key[0], row.get(leaf.key[0])) for leaf in layout)
                                 for row in self._resp_rows]

    def __getstate__(self):
        return self._shared

    def __setstate__(self, shared):
        self.__init__(shared)

    def _write(self, slot: int, values: list) -> None:
        for row, value in zip(self._req_rows[slot], values):
            row.copy_(value)
        self.control.enqueued[slot] = time.monotonic()
        self.control.state[slot] = READY
        self.doorbell.release()

    def _validate(self, td: TensorDictBase) -> list:
        """The request's leaf tensors in layout order, checked as `Layout.validate` checks them."""
        problem = self.status.problem(probe=False)
        if problem is not None:
            raise PeerFailureError(problem)
        if isinstance(td, TensorDictBase):
            values = []
            try:
                for key, shape, dtype in self._checks:
                    value = td[key]  # reads as ``get`` does at a third of its cost, but raises for a missing key
                    if not (isinstance(value, torch.Tensor) and value.shape == shape and value.dtype == dtype
                            and value.is_cpu):
                        break
                    values.append(value)
                else:
                    return values
            except Exception:  # noqa: BLE001 - decided (and reported) by the validation below
                pass
        # Something does not match: the layout's own validation raises the precise LayoutError.
        checked = self.request_layout.validate(td)
        return [checked.get(key) for key, *_ in self._checks]

    def _answer(self, slot: int) -> TensorDictBase:
        """A private copy of slot ``slot``'s answer."""
        if self._resp_leaves is None:
            return self._resp_rows[slot].clone()
        return clones(self._resp_leaves[slot], self._resp_size, self._resp_device)

    def _release(self, slot: int) -> None:
        """Give the slot back once its answer was read."""


class SlotFuture(ResponseFuture):
    """The answer to one request in a shared-memory slot; reading it gives the slot back."""

    def __init__(self, client: SlotClientBase, slot: int):
        self.client, self.slot = client, slot
        self._outcome = None

    def _poll(self, step: float) -> bool:
        if self._outcome is not None:
            return True
        c, slot = self.client, self.slot
        states = c.control.state
        if states is None:  # the owner closed the transport in this very process: nothing answers (wait_for says why)
            return False
        sem = c.answered[slot]
        if step <= 0:
            woken = sem.acquire(False)
        elif np.count_nonzero(states) <= 1:  # spin only as the sole request in flight: with many waiters,
            woken = c.spin.wait(functools.partial(sem.acquire, False),  # spinning steals the server's CPU
                                functools.partial(sem.acquire, timeout=step))
        else:
            woken = sem.acquire(timeout=step)
        states = c.control.state  # closed while this thread waited: as above
        if not woken or states is None:
            return False
        state = states[slot]
        if state == ANSWERED:
            self._outcome = (True, c._answer(slot))
        elif state == FAILED:
            self._outcome = (False, c.control.read_error(slot))
        else:  # woken by mark_dead: the status check in wait_for reports it
            return False
        c._release(slot)
        return True

    def done(self) -> bool:
        return self._poll(0.0)

    def result(self, timeout: float | None = None):
        wait_for(self._poll, self.client.status, timeout, f"{self.client.status.name} request")
        ok, value = self._outcome
        if ok:
            return value
        raise value
