"""The serving side of the slot transports: sweeps READY slots in submission order, gathers them in one pass and
scatters the answers in one pass (see `transports.slots.control` for the slot states)."""

from __future__ import annotations

import functools
import time

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from .._shared import AdaptiveSpin
from ..base import Batch, ServerEndpoint
from ..kernel.errors import LayoutError, PeerFailureError
from ..layout import Layout
from ..segments import SlotBank
from .control import ANSWERED, FAILED, READY, SERVING, VERSION_KEY, Control
from .rows import clones, flat, leaves, lookup_key

_CPU = torch.device("cpu")
_ROW_COPY_BYTES = 8192  # answer rows at least this large are scattered row by row (see SlotServer.reply)


class SlotServerSide:
    """The shared pieces a serving process needs, picklable for the trip there."""

    def __init__(self, shared: dict):
        self.shared = shared

    def server(self) -> "SlotServer":
        """Build the serving endpoint over the shared pieces; call it in the serving process."""
        return SlotServer(self.shared)


class SlotServer(ServerEndpoint):
    """Sweeps READY slots in submission order; gathers them in one pass and scatters answers in one pass."""

    stamps_version = True

    def __init__(self, shared: dict):
        self.requests: SlotBank = shared["requests"]
        self.responses: SlotBank = shared["responses"]
        self.control: Control = shared["control"]
        self.doorbell = shared["doorbell"]
        self.answered = shared["answered"]
        self._spin, self._rung = AdaptiveSpin(), functools.partial(self.doorbell.acquire, False)
        self.response_layout: Layout = self.responses.layout
        # Built once (see SlotClientBase): one-slot request views for single-request batches, the response
        # leaf banks with the shapes a stacked answer must have, and per slot the response leaf views.
        # Batches carry device "cpu" (every slot leaf is a CPU tensor, see _cpu_only): the serving loop moves a
        # batch whose device differs to the policy device, and for a CPU policy that move would be a no-op
        # costing more than the rest of a small round trip. ``to`` keeps the shared-memory views (no copy).
        self._req_all = self.requests.slots.to("cpu")
        self._req_one = [self._req_all[slot : slot + 1] for slot in range(self.requests.num_slots)]
        # A flat request layout builds a one-request batch from clones of the slot's leaf views (see clones).
        request_layout = self.requests.layout
        self._one_size = torch.Size((1, *request_layout.batch_size))
        self._req_one_leaves = None
        if flat(request_layout):
            self._req_banks = [(leaf.key[0], self.requests.slots.get(leaf.key)) for leaf in request_layout]
            self._req_one_leaves = [leaves((key, bank[slot : slot + 1]) for key, bank in self._req_banks)
                                    for slot in range(self.requests.num_slots)]
        # ``policy_version`` is not copied out of ``out``: reply writes the batch's version into the slots' integers
        # (stamps_version), which costs less than the loop setting a version tensor and reply copying it.
        self._versions = None
        answered = self.response_layout
        if VERSION_KEY in answered.keys:
            self._versions = self.responses.slots.get(VERSION_KEY).numpy()
            answered = Layout(tuple(leaf for leaf in answered if leaf.key != VERSION_KEY), answered.batch_size)
        self._answered = answered  # what ``out`` must hold
        self._resp_banks = [(lookup_key(leaf.key), torch.Size(leaf.shape), leaf.dtype,
                             self.responses.slots.get(leaf.key)) for leaf in answered]
        # Scattering answers: index_copy_ for small rows (one call for the batch); row by row for large ones, where
        # index_copy_ goes element by element (measured on the inference benchmark's page).
        self._stacked_shapes: dict = {}  # batch size -> the shape of each answer leaf stacked for it
        self._resp_by_row = [bank[0].nbytes >= _ROW_COPY_BYTES for *_, bank in self._resp_banks]
        self._resp_one = [[bank[slot : slot + 1] for *_, bank in self._resp_banks]
                          for slot in range(self.responses.num_slots)]
        # reply copies exactly the response keys out of ``out``; batches hold exactly the request keys.
        self.fixed_keys = (frozenset(request_layout.keys), frozenset(self.response_layout.keys))
        self._into: list | None = None  # (key, bank, buffer) once gather_into is given buffers

    def gather_into(self, buffers: dict) -> bool:
        """Gather into ``buffers`` from now on (flat layouts, each key's buffer of the slot's shape and dtype, with at
        least as many rows as a batch takes); nested layouts keep gathering into fresh tensors."""
        if self._req_one_leaves is None or {key for key, _ in self._req_banks} != set(buffers):
            return False
        for key, bank in self._req_banks:
            buffer = buffers[key]
            if buffer.dtype != bank.dtype or buffer.shape[1:] != bank.shape[1:] or buffer.device.type != "cpu":
                return False
        self._into = [(key, bank, buffers[key]) for key, bank in self._req_banks]
        return True

    def _ready(self) -> list:
        """READY slots in submission order."""
        states = self.control.state.tolist()  # a snapshot; only this server moves a slot out of READY
        count = states.count(READY)
        if count <= 1:  # the common case at low load: no array work
            return [states.index(READY)] if count else []
        ready = [slot for slot, state in enumerate(states) if state == READY]
        enqueued = self.control.enqueued.tolist()
        ready.sort(key=enqueued.__getitem__)  # stable, as submission times may tie
        return ready

    def collect(self, max_n: int, min_n: int, timeout: float, poll: float) -> Batch | None:
        if not self._spin.wait(self._rung, functools.partial(self.doorbell.acquire, timeout=poll)):
            return None
        while self.doorbell.acquire(False):  # one sweep answers every ring so far
            pass
        ready = self._ready()
        if len(ready) < min_n:
            deadline = time.monotonic() + timeout
            while len(ready) < min_n and self.doorbell.acquire(timeout=max(0.0, deadline - time.monotonic())):
                ready = self._ready()
        if len(ready) == 0:
            return None
        if len(ready) > max_n:
            # Their rings were drained above (later arrivals ring again themselves): come straight back.
            self.doorbell.release()
            ready = ready[:max_n]
        state, enqueued = self.control.state, self.control.enqueued
        if len(ready) == 1:  # the common case at low load: a slice copy, no TensorDict gather
            slot = ready[0]
            state[slot] = SERVING
            return Batch(handles=ready, stacked=self._one(slot), enqueued=[float(enqueued[slot])])
        state[ready] = SERVING
        return Batch(handles=ready, stacked=self._gather(torch.tensor(ready)), enqueued=enqueued[ready].tolist())

    def _gather(self, index: torch.Tensor) -> TensorDictBase:
        """A copy of the slots ``index`` as one batch. ``index_select`` copies rows as blocks; indexing with a
        tensor goes element by element (see the inference benchmark's page)."""
        size = torch.Size((len(index), *self._one_size[1:]))
        if self._into is not None:  # straight into the staging buffers (pinned host memory for a CUDA policy)
            n = len(index)
            return TensorDict._new_unsafe({key: torch.index_select(bank, 0, index, out=buffer[:n])
                                           for key, bank, buffer in self._into}, batch_size=size, device=_CPU)
        if self._req_one_leaves is None:  # nested keys
            return self._req_all.apply(lambda leaf: leaf.index_select(0, index), batch_size=size)
        return TensorDict._new_unsafe({key: bank.index_select(0, index) for key, bank in self._req_banks},
                                      batch_size=size, device=_CPU)

    def _one(self, slot: int) -> TensorDictBase:
        """A copy of slot ``slot`` as a batch of one (device "cpu", like every batch)."""
        if self._into is not None:
            return TensorDict._new_unsafe({key: buffer[:1].copy_(bank[slot : slot + 1])
                                           for key, bank, buffer in self._into}, batch_size=self._one_size, device=_CPU)
        if self._req_one_leaves is None:  # nested keys: the general copy
            return self._req_one[slot].clone()
        return clones(self._req_one_leaves[slot], self._one_size, _CPU)

    def _answers(self, out: TensorDictBase, n: int) -> list | None:
        """The answer leaves in layout order if ``out`` matches the response layout for ``n`` requests."""
        if not isinstance(out, TensorDictBase):
            return None
        shapes = self._stacked_shapes.get(n)
        if shapes is None:
            shapes = self._stacked_shapes[n] = [torch.Size((n, *shape)) for _, shape, _, _ in self._resp_banks]
        values = []
        try:
            for (key, _, dtype, _), shape in zip(self._resp_banks, shapes):
                value = out[key]  # reads as ``get`` does at a third of its cost, but raises for a missing key
                if not (isinstance(value, torch.Tensor) and value.dtype == dtype and value.shape == shape
                        and value.is_cpu):
                    return None
                values.append(value)
        except Exception:  # noqa: BLE001 - decided (and reported) by the layout's validation in reply
            return None
        return values

    def reply(self, batch: Batch, out: TensorDictBase) -> None:
        handles = batch.handles
        n = len(handles)
        values = self._answers(out, n)
        if values is None:  # the layout's own validation names what is wrong
            try:
                out = self._answered.validate_stacked(out, n)
            except LayoutError as exc:
                self.fail(batch, exc)
                return
            values = [out.get(key).cpu() for key, *_ in self._resp_banks]  # the slots are CPU tensors
        if n == 1:
            slot = handles[0]
            for view, value in zip(self._resp_one[slot], values):
                view.copy_(value)
            if self._versions is not None:
                self._versions[slot] = batch.version
            self.control.state[slot] = ANSWERED
            self.answered[slot].release()
            return
        if self._versions is not None:
            self._versions[handles] = batch.version
        index = torch.as_tensor(handles)
        for (_, _, _, bank), by_row, value in zip(self._resp_banks, self._resp_by_row, values):
            if by_row:
                for row, slot in enumerate(handles):
                    bank[slot].copy_(value[row])
            else:
                bank.index_copy_(0, index, value)
        self.control.state[handles] = ANSWERED
        for slot in handles:
            self.answered[slot].release()

    def fail(self, batch: Batch, error: BaseException) -> None:
        for slot in batch.handles:
            self.control.write_error(slot, error)
        self.control.state[batch.handles] = FAILED
        for slot in batch.handles:
            self.answered[slot].release()

    def close(self, reason: str = "the server was shut down") -> None:
        waiting = np.flatnonzero((self.control.state == READY) | (self.control.state == SERVING))
        if len(waiting):
            self.fail(Batch(handles=waiting.tolist()), PeerFailureError(reason))


