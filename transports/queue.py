"""``queue``: pickled TensorDicts over multiprocessing: one bounded request queue, one pipe back per client.

Rules: create clients in the owner's process, before spawning the processes that use them, and hand them
over as ``Process`` arguments (multiprocessing shares queues and pipes by inheritance only). Any picklable
value may travel, non-tensor leaves included; layouts may change between calls. ``max_clients`` response
pipes are made up front so clients can be created after the server started. ``max_queue_size`` bounds
pending requests: producers block when it is full.
"""

from __future__ import annotations

import itertools
import multiprocessing as mp
import pickle
import queue as std_queue
import threading
import time

import torch
from tensordict import TensorDict, TensorDictBase

from ._shared import EndpointClaims, PeerStatus, wait_for
from .base import Batch, RequestReplyTransport, ResponseFuture, ServerEndpoint, drain
from .config import TransportConfig
from .errors import PeerFailureError, RemoteError, ServiceError, TransportError

_OK, _ERR = 0, 1


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
    """The ``(key, tensor)`` leaves of ``value`` if it travels as raw bytes (see :func:`to_wire`), else ``None``."""
    if type(value) is not TensorDict or value.is_locked or value._has_names():
        return None
    leaves = list(value.items())
    for _, t in leaves:
        if (type(t) is not torch.Tensor or t.device.type != "cpu" or t.requires_grad or t.layout is not torch.strided
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
    """Rebuild what :func:`to_wire` sent."""
    raw, value = wire
    if not raw:
        return value
    batch_size, device, leaves = value
    tensors = {}
    for key, dtype, shape, data in leaves:
        tensors[key] = torch.frombuffer(data, dtype=dtype).view(shape) if len(data) else torch.empty(shape, dtype=dtype)
    # The leaves are what a valid TensorDict of CPU tensors held: skip the constructor's checks (tensordict is pinned).
    return TensorDict._new_unsafe(tensors, batch_size=torch.Size(batch_size), device=device)


class QueueTransport(RequestReplyTransport):
    """Request/reply across processes with pickled payloads.

    Args:
        max_clients: client endpoints this transport can hand out.
        max_queue_size: most pending requests before producers block.
        context: multiprocessing start method of the processes involved.

    Example:
        >>> transport = QueueTransport(max_clients=8)
        >>> clients = [transport.client() for _ in range(4)]   # before spawning workers
    """

    kind = "queue"
    cross_process = True

    def __init__(self, max_clients: int = 32, max_queue_size: int = 1024, context: str = "spawn"):
        super().__init__()
        ctx = mp.get_context(context)
        self.max_clients, self.max_queue_size, self.context = max_clients, max_queue_size, context
        self.requests = ctx.Queue(max_queue_size)
        self.pipes = [ctx.Pipe(duplex=False) for _ in range(max_clients)]
        self.status = PeerStatus()
        self.claims = EndpointClaims(max_clients, ctx.Lock())
        self._next = 0

    @property
    def config(self) -> TransportConfig:
        return TransportConfig(self.kind, {"max_clients": self.max_clients, "max_queue_size": self.max_queue_size})

    def client(self) -> "QueueClient":
        if self._next >= self.max_clients:
            raise TransportError(f"all {self.max_clients} client endpoints are in use; raise max_clients")
        index, self._next = self._next, self._next + 1
        return QueueClient(index, self.requests, self.pipes[index][0], self.status, self.claims)

    def server(self) -> "QueueServer":
        return QueueServer(self.requests, [w for _, w in self.pipes])

    def server_side(self) -> "QueueServerSide":
        return QueueServerSide(self.requests, [w for _, w in self.pipes])

    def mark_serving(self, pid: int) -> None:
        self.status.set_serving(pid)

    def mark_dead(self, *, stopped: bool) -> None:
        self.status.set_dead(stopped)

    def _close(self) -> None:
        self.status.set_dead(stopped=True)
        self.requests.close()
        self.requests.cancel_join_thread()
        for r, w in self.pipes:
            r.close()
            w.close()
        self.status.close()
        self.claims.close()


class _QueueFuture(ResponseFuture):
    def __init__(self, client: "QueueClient", request_id: int):
        self.client, self.request_id = client, request_id

    def done(self) -> bool:
        return self.request_id in self.client._answers or self.client._receive(0.0, self.request_id)

    def result(self, timeout: float | None = None):
        c = self.client
        wait_for(lambda step: c._receive(step, self.request_id), c.status, timeout, "inference request")
        status, payload = c._answers.pop(self.request_id)
        if status == _ERR:
            raise payload
        return payload


class QueueClient:
    """The client of a :class:`QueueTransport`: ``submit(td)`` returns a future; threads may share it, processes
    may not (each process needs its own client: answers come back on the client's own pipe)."""

    def __init__(self, index: int, requests, reader, status: PeerStatus, claims: EndpointClaims):
        self.index, self.requests, self.reader, self.status, self.claims = index, requests, reader, status, claims
        self._ids = itertools.count()
        self._answers: dict[int, tuple] = {}
        self._cond = threading.Condition()
        self._receiving = False

    def __getstate__(self):
        return {"index": self.index, "requests": self.requests, "reader": self.reader, "status": self.status,
                "claims": self.claims}

    def __setstate__(self, state):
        self.__init__(**state)

    def submit(self, td: TensorDictBase) -> _QueueFuture:
        problem = self.status.problem()
        if problem is not None:
            raise PeerFailureError(problem)
        self.claims.claim(self.index, "queue client endpoint")
        request_id = next(self._ids)
        payload = pickle.dumps(to_wire(td), protocol=pickle.HIGHEST_PROTOCOL)
        item = (self.index, request_id, time.monotonic(), payload)
        while True:
            try:
                self.requests.put(item, timeout=0.1)
                break
            except std_queue.Full:  # backpressure; but never wait on a dead server
                problem = self.status.problem()
                if problem is not None:
                    raise PeerFailureError(problem) from None
        return _QueueFuture(self, request_id)

    def _receive(self, step: float, request_id: int) -> bool:
        """Wait up to ``step`` s for answers (one thread reads the pipe at a time); True once ours is there."""
        with self._cond:
            if request_id in self._answers:
                return True
            if self._receiving:
                self._cond.wait(step)
                return request_id in self._answers
            self._receiving = True
        try:
            if self.reader.poll(step):
                while True:
                    rid, status, payload = pickle.loads(self.reader.recv_bytes())
                    if status == _OK:
                        payload = from_wire(payload)
                    with self._cond:
                        self._answers[rid] = (status, payload)
                    # Ours is here: stop (a poll costs more than the rest of a small answer; answers still in the
                    # pipe are read by whoever waits for them). Else read on while there is more.
                    if rid == request_id or not self.reader.poll(0):
                        break
        except (EOFError, OSError):
            pass  # the peer check in wait_for turns this into a peer failure
        finally:
            with self._cond:
                self._receiving = False
                self._cond.notify_all()
        return request_id in self._answers


class QueueServerSide:
    """The server's share of a :class:`QueueTransport`: the request queue and the writing ends of the pipes."""

    def __init__(self, requests, writers):
        self.requests, self.writers = requests, writers

    def server(self) -> "QueueServer":
        return QueueServer(self.requests, self.writers)


class QueueServer(ServerEndpoint):
    def __init__(self, requests, writers):
        self.requests, self.writers = requests, writers

    def collect(self, max_n: int, min_n: int, timeout: float, poll: float) -> Batch | None:
        items = drain(self.requests, max_n, min_n, timeout, poll)
        if not items:
            return None
        handles, requests, enqueued = [], [], []
        for client, rid, t, payload in items:
            handles.append((client, rid))
            requests.append(from_wire(pickle.loads(payload)))
            enqueued.append(t)
        return Batch(handles=handles, requests=requests, enqueued=enqueued)

    def _send(self, client: int, message: tuple) -> None:
        try:
            self.writers[client].send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))
        except (BrokenPipeError, OSError):
            pass  # the client process is gone; nobody waits for this answer

    def reply(self, batch: Batch, out: TensorDictBase) -> None:
        for (client, rid), row in zip(batch.handles, rows_to_wire(out, len(batch))):
            self._send(client, (rid, _OK, row))

    def fail(self, batch: Batch, error: BaseException) -> None:
        if not isinstance(error, ServiceError):
            error = RemoteError.from_exception(error)
        for client, rid in batch.handles:
            self._send(client, (rid, _ERR, error))

    def close(self, reason: str = "the server was shut down") -> None:
        # Requests still queued get a clear answer instead of waiting for the peer check.
        while True:
            try:
                client, rid, _, _ = self.requests.get_nowait()
            except (std_queue.Empty, OSError, ValueError):
                return
            self._send(client, (rid, _ERR, PeerFailureError(reason)))


