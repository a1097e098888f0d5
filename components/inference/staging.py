"""Moving fixed-layout batches to a CUDA policy and back: pinned host staging, a persistent device batch, and one
CUDA event per pass.

A fixed-slot transport (``shared_memory``, ``process_slot``) gathers the ready slots straight into the pinned host
buffers of `DeviceStaging` (see `transports.slots.server.SlotServer.gather_into`); each leaf is then
copied without blocking into the same rows of a device batch allocated once. The answers come back the same way,
into pinned host buffers, and the pass waits on one CUDA event recorded after the last copy (not a device-wide
synchronize, and not one wait per leaf as ``TensorDict.to("cpu")`` does). Pinned buffers are reused from pass to
pass: the serving loop serves one batch at a time, and a pass returns only once its copies are done.

Without CUDA (tests on CPU machines) the same logic runs with plain host buffers and no event.
"""

from __future__ import annotations

import torch
from tensordict import TensorDict, TensorDictBase

from transports.layout import Layout


class DeviceStaging:
    """Host staging buffers and a persistent device batch for one request layout.

    Args:
        request: the layout of one request (the transport's).
        rows: the most rows a batch has (the static batch size, else ``max_batch_size``).
        device: the policy device.
        device_batch: the persistent device batch to fill (a static batch's graph input), or ``None`` for one of
            its own.
    """

    def __init__(self, request: Layout, rows: int, device: torch.device, device_batch: TensorDictBase | None = None):
        self.device = torch.device(device)
        self.rows = rows
        self.pinned = self.device.type == "cuda"  # page-locked memory needs a CUDA runtime
        self.keys = [leaf.key for leaf in request]
        self.host_in = {leaf.key: self._host((rows, *leaf.shape), leaf.dtype) for leaf in request}
        self.device_batch = device_batch if device_batch is not None else TensorDict(
            {leaf.key: torch.zeros((rows, *leaf.shape), dtype=leaf.dtype, device=self.device) for leaf in request},
            batch_size=(rows, *request.batch_size), device=self.device)
        self._batch_rest = tuple(request.batch_size)
        self.host_out: dict = {}  # answer leaf key -> host buffer, made for the first answer that has the leaf
        self.event = torch.cuda.Event() if self.pinned else None

    def _host(self, shape: tuple, dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(shape, dtype=dtype, pin_memory=self.pinned)

    def host_views(self) -> dict:
        """The host input buffers by leaf key (first-level key for flat layouts), for a transport to gather into."""
        return {key[0] if len(key) == 1 else key: buffer for key, buffer in self.host_in.items()}

    def load(self, td: TensorDictBase) -> TensorDictBase:
        """Copy a host batch of ``n`` rows into the first ``n`` rows of the device batch (returned as a view).

        Leaves already in the host buffers (a transport gathered into them) are copied from there without blocking;
        others go through the buffers first, so the copy to the device never waits.
        """
        n = td.batch_size[0]
        for key in self.keys:
            value, host = td.get(key), self.host_in[key]
            staged = host[:n]
            if value.data_ptr() != staged.data_ptr():
                staged.copy_(value)
            self.device_batch.get(key)[:n].copy_(staged, non_blocking=self.pinned)
        return self.device_batch[:n]

    def unload(self, out: TensorDictBase) -> TensorDictBase:
        """The answers of ``out`` (on the device) copied into host buffers: one event waits for every copy.

        Returns:
            A TensorDict of views of the host buffers (valid until the next pass).
        """
        n = out.batch_size[0]
        answer = TensorDict(batch_size=out.batch_size, device=torch.device("cpu"))
        for key, value in out.items(True, True):
            host = self.host_out.get(key)
            if host is None or host.dtype != value.dtype or host.shape[1:] != value.shape[1:]:
                host = self.host_out[key] = self._host((self.rows, *value.shape[1:]), value.dtype)
            host[:n].copy_(value, non_blocking=self.pinned)
            answer.set(key, host[:n])
        if self.event is not None:
            self.event.record(torch.cuda.current_stream(self.device))
            self.event.synchronize()
        return answer
