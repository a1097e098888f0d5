"""The ``queue`` transport's wire format: what travels for a payload, and the framing of one message.

A plain, flat TensorDict of CPU tensors travels as its leaves' raw bytes (rebuilt without pickling the
TensorDict); anything else is pickled as it is. Messages use the framing of
`multiprocessing.connection.Connection.send_bytes`, so either end reads them with ``recv_bytes``.
"""

from __future__ import annotations

import pickle
import struct

import torch
from tensordict import TensorDict, TensorDictBase

_JOIN_BELOW = 1 << 16  # join the header to payloads up to this size (one send); larger ones go separately


def compact(td: TensorDictBase) -> TensorDictBase:
    """Copy only the leaves that view a larger storage: pickling a view would send the whole storage."""
    if not isinstance(td, TensorDictBase):  # commands and other values travel as they are
        return td
    if any(t.untyped_storage().nbytes() > t.nbytes for t in td.values(True, True) if hasattr(t, "untyped_storage")):
        return td.clone()
    return td


# dtypes torch.frombuffer rebuilds exactly from raw bytes
_RAW_DTYPES = frozenset({torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
                         torch.bfloat16, torch.float32, torch.float64, torch.complex64, torch.complex128})


def to_wire(value):
    """What travels for ``value``: ``(True, fields)`` for a plain, flat TensorDict of CPU tensors, else
    ``(False, value)`` pickled as it is.

    Pickling a TensorDict (and each tensor's storage) costs tens of microseconds each way, more than the rest of
    a small round trip; raw leaf bytes (one copy of exactly the leaf, so views never drag their storage along)
    rebuild the same TensorDict at a fraction of that. Anything else (nested, named, locked, non-tensor
    leaves, subclasses, gradients, other devices) keeps the general path.
    """
    leaves = _raw_leaves(value)
    if leaves is None:
        return False, compact(value)
    return True, (tuple(value.batch_size), _device_name(value), [(key, t.dtype, tuple(t.shape), _raw(t))
                                                                 for key, t in leaves])


def rows_to_wire(value, n: int) -> list:
    """``[to_wire(value[i]) for i in range(n)]`` (``value``: whatever a server answers with, indexable by request),
    without building the row TensorDicts when ``value`` takes the raw path (a row of a plain TensorDict is one,
    with the same leaves indexed)."""
    leaves = _raw_leaves(value)
    if leaves is None or not value.batch_dims:
        return [to_wire(value[i]) for i in range(n)]
    batch_size, device = tuple(value.batch_size[1:]), _device_name(value)
    if n == 1 and value.batch_size[0] == 1:  # the whole leaf is the row: no indexing
        return [(True, (batch_size, device, [(key, t.dtype, tuple(t.shape[1:]), _raw(t)) for key, t in leaves]))]
    leaves = [(key, t.dtype, tuple(t.shape[1:]), t) for key, t in leaves]
    return [(True, (batch_size, device, [(key, dtype, shape, _raw(t[i])) for key, dtype, shape, t in leaves]))
            for i in range(n)]


def _raw_leaves(value) -> list | None:
    """The ``(key, tensor)`` leaves of ``value`` if it travels as raw bytes (see `to_wire`), else ``None``."""
    if type(value) is not TensorDict or value.is_locked or value._has_names():
        return None
    leaves = list(value.items())
    for _, t in leaves:
        if (type(t) is not torch.Tensor or not t.is_cpu or t.requires_grad or t.layout is not torch.strided
                or t.dtype not in _RAW_DTYPES or t.is_conj() or t.is_neg()):
            return None
    return leaves


# dtypes whose tensors numpy views directly (bfloat16 has no numpy dtype: it goes through a uint8 view)
_NUMPY_DTYPES = _RAW_DTYPES - {torch.bfloat16}


def _raw(t: torch.Tensor) -> pickle.PickleBuffer:
    """Exactly the leaf's bytes, copied once when pickled (a view never drags its storage along). A PickleBuffer of
    a writable array unpickles as a bytearray: a writable buffer without another copy."""
    if t.dtype in _NUMPY_DTYPES and t.is_contiguous():
        return pickle.PickleBuffer(t.numpy())  # the cheapest route to the buffer
    return pickle.PickleBuffer(t.contiguous().reshape(-1).view(torch.uint8).numpy())


def _device_name(value) -> str | None:
    return None if value.device is None else str(value.device)


def from_wire(wire):
    """Rebuild what `to_wire` sent."""
    raw, value = wire
    if not raw:
        return value
    batch_size, device, leaves = value
    tensors = {}
    for key, dtype, shape, data in leaves:
        tensors[key] = torch.frombuffer(data, dtype=dtype).view(shape) if len(data) else torch.empty(shape, dtype=dtype)
    # The leaves are what a valid TensorDict of CPU tensors held: skip the constructor's checks (tensordict is pinned).
    return TensorDict._new_unsafe(tensors, batch_size=torch.Size(batch_size), device=device)


def frame(payload: bytes) -> list:
    """``payload`` with the framing ``Connection.recv_bytes`` reads: the pieces to send, in order."""
    n = len(payload)
    header = struct.pack("!i", n) if n <= 0x7FFFFFFF else struct.pack("!iQ", -1, n)
    return [header + payload] if n <= _JOIN_BELOW else [header, payload]
