"""Slot banks in shared memory with semaphore doorbells: the mechanism under ``shared_memory`` and
``process_slot``.

Requests and responses live in two :class:`~transports._shared.SlotBank` s (fixed layouts, tensors only);
only slot states and semaphore posts move between processes. A control block holds per slot its state,
its submission time and room for an error text (errors travel as text, never pickled).

Slot states: FREE -> CLAIMED (a client holds it) -> READY (request written, server notified) -> SERVING
(gathered into a batch) -> ANSWERED / FAILED (response written, client notified) -> FREE.
"""

from __future__ import annotations

import functools
import time

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from ._shared import AdaptiveSpin, PeerStatus, wait_for
from .segments import Segment, SlotBank
from .base import RequestReplyTransport, ResponseFuture
from .descriptor import SlotOptions
from .kernel.errors import ConfigurationError, PeerFailureError, error_from_text, error_to_text
from .layout import Layout
from .sync import Semaphore

FREE, CLAIMED, READY, SERVING, ANSWERED, FAILED = range(6)
ERROR_BYTES = 8192
_CPU = torch.device("cpu")
VERSION_KEY = ("policy_version",)
_ROW_COPY_BYTES = 8192  # answer rows at least this large are scattered row by row (see SlotServer.reply)


class _Control:
    """Per-slot state (int64), submission time (float64) and error text, in one shared segment."""

    def __init__(self, num_slots: int, segment: Segment | None = None):
        self.num_slots = num_slots
        self.segment = segment or Segment(num_slots * (16 + ERROR_BYTES))  # SlotTransport.shared_memory_bytes
        buf = self.segment.buf
        self.state = np.frombuffer(buf, dtype=np.int64, count=num_slots)
        self.enqueued = np.frombuffer(buf, dtype=np.float64, count=num_slots, offset=8 * num_slots)
        self.errors = np.frombuffer(buf, dtype=np.uint8, count=num_slots * ERROR_BYTES, offset=16 * num_slots).reshape(
            num_slots, ERROR_BYTES
        )

    def __reduce__(self):
        return (_Control, (self.num_slots, self.segment))

    def write_error(self, slot: int, error: BaseException) -> None:
        data = error_to_text(error, ERROR_BYTES - 8).encode()[: ERROR_BYTES - 8]
        self.errors[slot, :8] = np.frombuffer(len(data).to_bytes(8, "little"), dtype=np.uint8)
        self.errors[slot, 8 : 8 + len(data)] = np.frombuffer(data, dtype=np.uint8)

    def read_error(self, slot: int) -> BaseException:
        n = int.from_bytes(self.errors[slot, :8].tobytes(), "little")
        return error_from_text(self.errors[slot, 8 : 8 + n].tobytes())

    def close(self) -> None:
        self.state = self.enqueued = self.errors = None
        self.segment.close()


class SlotTransport(RequestReplyTransport):
    """Base of the fixed-layout slot transports.

    Args:
        request_layout: layout of one request (a :class:`Layout` or a representative TensorDict).
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
        self.control = _Control(num_slots)
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
        from ._slot_server import SlotServer

        return SlotServer(self)

    def server_side(self):
        from ._slot_server import SlotServerSide

        return SlotServerSide(self._shared())

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

    def _shared(self) -> dict:
        return {
            "request_layout": self.request_layout,
            "requests": self.requests,
            "responses": self.responses,
            "control": self.control,
            "doorbell": self.doorbell,
            "answered": self.answered,
            "status": self.status,
        }


def _lookup_key(key: tuple):
    """The cheapest TensorDict key for a layout key: a string for a top-level key."""
    return key[0] if len(key) == 1 else key


def _flat(layout: Layout) -> bool:
    """Whether every leaf of ``layout`` is a top-level key."""
    return all(len(leaf.key) == 1 for leaf in layout)


def _copier(view: torch.Tensor):
    """A function returning a fresh copy of ``view`` (a slot's leaf in shared memory). Through numpy where the dtype
    allows: ``Tensor.clone`` of a small tensor costs about twice a numpy copy wrapped by ``torch.from_numpy``.
    Such a copy owns its memory and pickles and shares like any tensor, but cannot be resized in place."""
    try:
        array = view.numpy()
    except (TypeError, RuntimeError):  # a dtype numpy lacks (bfloat16...): the torch copy
        return view.clone
    from_numpy = torch.from_numpy
    return lambda: from_numpy(array.copy())


def _leaves(pairs) -> list:
    """``(key, copier)`` for ``(key, view)`` pairs: the input of :func:`_clones`."""
    return [(key, _copier(view)) for key, view in pairs]


def _clones(leaves: list, batch_size: torch.Size, device) -> TensorDictBase:
    """A TensorDict of fresh copies of a flat layout's leaves (``(key, copier)`` pairs, see :func:`_leaves`),
    built directly: TensorDict.clone costs several times the copies of a small payload. tensordict is pinned;
    ``_new_unsafe`` skips the checks a TensorDict of fresh CPU copies does not need."""
    return TensorDict._new_unsafe({key: copy() for key, copy in leaves}, batch_size=batch_size, device=device,
                                  nested=False)


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
        self.control: _Control = shared["control"]
        self.doorbell = shared["doorbell"]
        self.answered = shared["answered"]
        self.status: PeerStatus = shared["status"]
        self.spin = AdaptiveSpin()  # this client's own, in its own process
        # Hot-path state, built once: the checks of each request leaf, and per slot the request leaf views and
        # the response TensorDict view (indexing a TensorDict costs more than the whole copy of a small payload).
        # Slot layouts are CPU-only (_cpu_only), so ``is_cpu`` is the device check; a flat key is looked up as a string.
        self._checks = [(_lookup_key(leaf.key), torch.Size(leaf.shape), leaf.dtype) for leaf in self.request_layout]
        banks = [self.requests.slots.get(leaf.key) for leaf in self.request_layout]
        self._req_rows = [[bank[slot] for bank in banks] for slot in range(self.requests.num_slots)]
        self._resp_rows = [self.responses.slots[slot] for slot in range(self.responses.num_slots)]
        # A flat response layout answers with clones of the slot's leaf views (see _clones); nested keys take the
        # general clone.
        layout = self.responses.layout
        self._resp_leaves = None
        if _flat(layout):
            self._resp_size, self._resp_device = torch.Size(layout.batch_size), self._resp_rows[0].device
            self._resp_leaves = [_leaves((leaf.key[0], row.get(leaf.key[0])) for leaf in layout)
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
        """The request's leaf tensors in layout order, checked as :meth:`Layout.validate` checks them."""
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
        return _clones(self._resp_leaves[slot], self._resp_size, self._resp_device)

    def _release(self, slot: int) -> None:
        """Give the slot back once its answer was read."""


class SlotFuture(ResponseFuture):
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
