"""The framing of one message of the ``distributed`` transport on a pair of standalone groups (see
`transports.distributed.gloo` for the store and the groups), and a client's connected endpoint.

A message is a fixed 32-byte header (`HEADER`: magic, kind, request id, an auxiliary count) and, for
requests and replies, the payload's leaves packed in the layout's key order. Errors and shutdown reasons are
UTF-8 JSON text of the length the header announces (at most `MAX_TEXT_BYTES`). Nothing received is
unpickled: a header with the wrong magic, an unknown kind or an oversized count is a
`MalformedMessage`, and the channel that carried it is dropped.
"""

from __future__ import annotations

import atexit
import datetime
import itertools
import struct
import threading
import weakref
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from .devices import side_device
from .gloo import IDLE
from ..kernel.errors import PeerFailureError, TransportError, error_from_text
from ..layout import Layout
from ..local import LocalFuture

HEADER = struct.Struct("<QqqQ")
"""magic, kind, request id, auxiliary count (text length of ERROR / SHUTDOWN)."""
MAGIC = 0x31445352_4C52  # "RLRSD1"
REQUEST, REPLY, ERROR, SHUTDOWN, BYE = 1, 2, 3, 4, 5
ANSWERS, ASKS = frozenset({REPLY, ERROR, SHUTDOWN, BYE}), frozenset({REQUEST, BYE})
"""What a client's side receives, and what a server's side does."""
MAX_TEXT_BYTES = 1 << 16
SEND_TIMEOUT_S = 10.0
"""Seconds a send waits for its peer to post the matching receive (peers always keep one posted)."""
_WAITS = {SEND_TIMEOUT_S: datetime.timedelta(seconds=SEND_TIMEOUT_S)}
SMALL_BYTES = 1 << 16
"""Messages up to this size land in one buffer per endpoint and their leaves are copied out; larger ones land in
a fresh buffer whose views become the leaves (no copy)."""


class MalformedMessage(TransportError):
    """A control message that is not one of ours: the channel that carried it is dropped, nothing is executed."""


class Wire:
    """One side of one endpoint: sends on one group, receives on the other.

    With gloo the header and the payload travel as one message; with NCCL the header (and any text) rides the
    gloo control groups and the payload the NCCL groups: the sender puts it on the data group right after its
    header, and the receiver posts the data receive only once that header has arrived and announced a REQUEST or a
    REPLY (`recv`), so a control message never meets a posted CUDA receive. The NCCL payload lives on this
    side's one CUDA device, the one its layouts name (`side_device`); over
    gloo a leaf on another device goes through host memory, and lands on its layout's device. Sends copy the
    payload's leaves into one buffer allocated once (checking each leaf against the layout on the way); messages
    up to `SMALL_BYTES` land in one buffer per endpoint and their leaves are copied out, larger ones land in
    a fresh buffer whose views become the received TensorDict's leaves (no copy after the receive).

    Args:
        out: ``(control group, payload group or None)`` this side sends on.
        inp: the same for receiving.
        send_layout: layout of what this side sends (``None``: control messages only).
        recv_layout: layout of what it receives.
        peer: the other rank.
    """

    def __init__(self, out: tuple, inp: tuple, send_layout: Layout | None, recv_layout: Layout | None, peer: int):
        self.out, self.inp, self.peer = out, inp, peer
        self.send_layout, self.recv_layout = send_layout, recv_layout
        self._combined_out, self._combined_in = out[1] is None, inp[1] is None
        # NCCL: this side's payloads live on one CUDA device, the one its own layouts name (None: no payload leaves)
        self.device = None if self._combined_out and self._combined_in else \
            side_device((send_layout, recv_layout), "nccl")
        self._send_buf, self._send_views = _buffers(send_layout, self._combined_out)
        self._recv_size = _buffers(recv_layout, self._combined_in, allocate=False)
        self._header = torch.zeros(HEADER.size, dtype=torch.uint8)
        self._recv_header = torch.zeros(HEADER.size, dtype=torch.uint8)
        self._flat = recv_layout is None or all(len(leaf.key) == 1 for leaf in recv_layout)
        # made once: what each send and receive would otherwise rebuild (torch ops cost microseconds each)
        self._send_np = (self._send_buf if self._combined_out else self._header).numpy()
        self._send_all = [self._send_buf] if self._combined_out else [self._header]
        self._send_control = [self._send_buf[: HEADER.size]] if self._combined_out else [self._header]
        self._checks = [(_key(leaf.key), leaf.shape, leaf.dtype, torch.device(leaf.device), self._send_views[leaf.key],
                         _host_array(self._send_views[leaf.key])) for leaf in send_layout or ()]
        small = self._combined_in and self._recv_size <= SMALL_BYTES  # small payloads: one buffer, leaves cloned
        self._recv_buf, views = _buffers(recv_layout, True) if small else (None, {})
        self._recv_np = None if self._recv_buf is None else self._recv_buf.numpy()
        self._recv_views = [(_key(key) if self._flat else key, view, _host_array(view)) for key, view in views.items()]
        self._recv_start = HEADER.size if self._combined_in else 0
        self._recv_batch = torch.Size(recv_layout.batch_size) if recv_layout is not None else None
        # gloo carries host memory: a leaf whose layout names another device is moved there once received
        self._moves = [(_key(leaf.key) if self._flat else leaf.key, torch.device(leaf.device))
                       for leaf in recv_layout or () if self._combined_in and leaf.device != "cpu"]
        self.lock = threading.Lock()  # one sender at a time on this side
        self._inflight: list = []  # (work, tensors it reads) of sends not yet known complete

    def send(self, kind: int, rid: int, values: Any = None, row: int | None = None, text: str = "",
             timeout: float = SEND_TIMEOUT_S) -> None:
        """Send one message: ``values`` (a TensorDict holding at least the send layout's keys; ``row``: take row
        ``row`` of each leaf) for REQUEST / REPLY, ``text`` for ERROR / SHUTDOWN.

        A gloo send completes only once the peer posts its receive; a peer that has not within ``timeout``
        seconds (hung, stopped) loses the channel: torch raises here and closes the pair, and the peer sees a
        closed connection.

        Raises:
            LayoutError: a declared key is missing or its value has another shape, dtype or device (nothing is sent).
        """
        wait = _WAITS.get(timeout) or datetime.timedelta(seconds=timeout)
        data = text.encode()[:MAX_TEXT_BYTES] if text else b""
        with self.lock:
            self._settle(wait)  # the previous message left the buffer (its completion is off the critical path)
            if values is not None:
                self._fill(values, row)
            HEADER.pack_into(self._send_np, 0, MAGIC, kind, rid, len(data))
            sent = self._send_all if values is not None else self._send_control
            self._inflight.append((self.out[0].send(sent, self.peer, 0), sent))
            if values is not None and not self._combined_out and self._send_buf.numel():  # pragma: no cover - NCCL
                # the payload after its header: the peer posts the matching receive once the header announced it
                self._inflight.append((self.out[1].send([self._send_buf], self.peer, 0), None))
            if data:
                text_buf = [torch.frombuffer(bytearray(data), dtype=torch.uint8)]
                self._inflight.append((self.out[0].send(text_buf, self.peer, 0), text_buf))
            if kind not in (REQUEST, REPLY):
                self._settle(wait)  # control messages are rare: wait, so the caller knows they left

    def _settle(self, wait: datetime.timedelta) -> None:
        """Wait for the sends still in flight (the buffers they read are reused next)."""
        while self._inflight:
            work, _ = self._inflight[0]
            work.wait(wait)
            self._inflight.pop(0)

    def _fill(self, values: Any, row: int | None) -> None:
        leaves = values._tensordict if type(values) is TensorDict else None  # its top-level entries, read directly
        for key, shape, dtype, device, view, array in self._checks:
            value = leaves.get(key) if leaves is not None and type(key) is str else values.get(key, None)
            if not isinstance(value, torch.Tensor) or value.dtype != dtype or value.device != device or \
                    (value.shape if row is None else value.shape[1:]) != shape:
                self.send_layout.validate(values if row is None else values[row])  # raises the precise error
            if array is not None:
                try:  # NumPy (one thread, and indexing a row costs less than in torch)
                    source = value.numpy()
                    np.copyto(array, source if row is None else source[row])
                    continue
                except (RuntimeError, TypeError):  # requires grad, a conjugate or negative view: torch's own copy
                    pass
            view.copy_(value if row is None else value[row])

    def recv(self, expect: frozenset) -> tuple[int, int, Any]:
        """Wait for one message of a kind in ``expect``: ``(kind, request id, payload TensorDict or text)``.

        Raises:
            MalformedMessage: not one of ours.
            RuntimeError: the connection closed (the peer died); raised by torch.
        """
        small = self._recv_buf is not None
        buf = self._recv_buf if small else torch.empty(self._recv_size, dtype=torch.uint8)
        header = buf[: HEADER.size] if self._combined_in and not small else self._recv_header
        self.inp[0].recv([buf if self._combined_in else header], self.peer, 0).wait(IDLE)
        magic, kind, rid, aux = HEADER.unpack_from(self._recv_np if small else header.numpy(), 0)
        if magic != MAGIC or kind not in expect or aux > MAX_TEXT_BYTES:
            raise MalformedMessage(f"malformed control message (magic {magic:#x}, kind {kind}, count {aux})")
        if kind in (REQUEST, REPLY):
            if not self._combined_in:  # NCCL: the data receive is posted now that a header announced the payload
                buf = self._receive_data()
            return kind, rid, self._payload(buf)
        text = ""
        if aux:
            data = torch.empty(aux, dtype=torch.uint8)
            self.inp[0].recv([data], self.peer, 0).wait(IDLE)
            text = data.numpy().tobytes().decode("utf-8", errors="replace")
        return kind, rid, text

    def _receive_data(self) -> torch.Tensor:
        """The payload a header announced, from the data group into a fresh buffer on this side's device; the
        receiving thread waits until it has landed, so the TensorDict it hands over is complete on any stream."""
        buf = torch.empty(self._recv_size, dtype=torch.uint8, device=self.device or "cpu")
        if self._recv_size:  # pragma: no cover - NCCL (a layout without leaves sends no data message)
            self.inp[1].recv([buf], self.peer, 0).wait(IDLE)
            torch.cuda.current_stream(buf.device).synchronize()
        return buf

    def _payload(self, buf: torch.Tensor) -> TensorDict:
        if buf is self._recv_buf:  # small: copies of the leaves (the buffer takes the next message)
            leaves = {key: view.clone() if array is None else torch.from_numpy(array.copy())
                      for key, view, array in self._recv_views}
        else:  # large: the fresh buffer's views are the leaves
            leaves = {_key(key) if self._flat else key: view
                      for key, view in _views(buf, self.recv_layout, self._recv_start).items()}
        for key, device in self._moves:
            leaves[key] = leaves[key].to(device)
        if self._flat:
            return TensorDict._new_unsafe(leaves, batch_size=self._recv_batch)
        out = TensorDict(batch_size=self.recv_layout.batch_size)
        for key, value in leaves.items():
            out.set(key, value)
        return out


def _host_array(view: torch.Tensor):
    """A NumPy view of a CPU buffer view, through which it is copied (``None``: a dtype NumPy lacks, or CUDA).

    The transport's own copies are plain single-threaded memcpys this way: torch splits a copy of more than 32K
    elements across its intra-op threads, whose spinning afterwards takes a core from the peer on a small machine
    (measured on the inference benchmark's page)."""
    try:
        return view.numpy() if view.device.type == "cpu" else None
    except TypeError:  # bfloat16 and the like
        return None


def _key(key: tuple) -> Any:
    """A TensorDict key as its cheapest form: a string for a top-level key."""
    return key[0] if len(key) == 1 else key


def _offsets(layout: Layout, start: int) -> list[int]:
    """Where each leaf starts in a message buffer: 8-byte aligned, so any dtype views it."""
    offsets, end = [], start
    for leaf in layout:
        offsets.append(end)
        end += -(-leaf.nbytes // 8) * 8
    return offsets


def _buffers(layout: Layout | None, with_header: bool, allocate: bool = True):
    """One flat buffer for a layout (after the header when they travel together) and a typed view per leaf; with
    ``allocate=False`` only its size."""
    start = HEADER.size if with_header else 0
    offsets = _offsets(layout, start) if layout is not None else []
    size = (offsets[-1] + -(-layout.leaves[-1].nbytes // 8) * 8) if offsets else start
    if not allocate:
        return size
    device = "cpu" if with_header or layout is None or not layout.leaves else layout.leaves[0].device
    buf = torch.zeros(size, dtype=torch.uint8, device=device)
    return buf, _views(buf, layout, start)


def _views(buf: torch.Tensor, layout: Layout | None, start: int) -> dict:
    """A typed view of ``buf`` per leaf of ``layout``, at the offsets `_offsets` gives."""
    if layout is None:
        return {}
    return {leaf.key: buf[offset:offset + leaf.nbytes].view(leaf.dtype).view(leaf.shape)
            for leaf, offset in zip(layout, _offsets(layout, start))}


_OPEN: "weakref.WeakSet[Connection]" = weakref.WeakSet()  # this process's, closed when it exits


class Connection:
    """A client's connected endpoint in one process: its wire, the requests in flight, the receiving thread. Closed
    when the process exits: a receiving thread inside gloo while the interpreter finalizes can abort the process."""

    def __init__(self, wire: Wire, name: str):
        self.wire, self.name = wire, name
        self.pending: dict[int, LocalFuture] = {}
        self.lock = threading.Lock()
        self.problem: str | None = None
        self.ids = itertools.count(1)
        self.thread = threading.Thread(target=self._receive, name=f"{name}-client-rx", daemon=True)
        self.thread.start()
        _OPEN.add(self)

    def close(self, timeout: float = 2.0) -> None:
        """Say BYE; the server answers BYE, which ends the receiving thread (waited for up to ``timeout``)."""
        if not self.thread.is_alive():
            return
        try:
            self.wire.send(BYE, 0, timeout=timeout)
        except Exception:  # noqa: BLE001 - the server is gone: the receiving thread ends on its own
            pass
        self.thread.join(timeout)

    def _receive(self) -> None:
        problem = f"the {self.name} server closed the connection (its process died)"
        try:
            while True:
                kind, rid, payload = self.wire.recv(ANSWERS)
                if kind == BYE:  # the answer to this side's BYE (close)
                    problem = f"the {self.name} endpoint was closed in this process"
                    return
                if kind == SHUTDOWN:
                    problem = f"the {self.name} server shut down ({payload or 'no reason given'})"
                    self.wire.send(BYE, 0)  # ends the server's receiving thread for this endpoint
                    return
                with self.lock:
                    future = self.pending.pop(rid, None)
                if future is not None:
                    future.set_result(payload) if kind == REPLY else future.set_exception(error_from_text(payload))
        except MalformedMessage as exc:
            problem = f"the {self.name} server sent {exc}"
        except Exception:  # noqa: BLE001 - the connection closed
            pass
        finally:
            with self.lock:
                self.problem = problem
                pending, self.pending = self.pending, {}
            for future in pending.values():
                future.set_exception(PeerFailureError(problem))


atexit.register(lambda: [connection.close(timeout=1.0) for connection in list(_OPEN)])
