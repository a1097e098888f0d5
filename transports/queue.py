"""``queue``: pickled TensorDicts over one local stream socket per client (requests out, answers back).

Rules: create clients in the owner's process, before spawning the processes that use them, and hand them
over as ``Process`` arguments (multiprocessing shares the sockets by inheritance only). Any picklable value may
travel, non-tensor leaves included; layouts may change between calls. ``max_clients`` channels are made up
front so clients can be created after the server started. ``max_queue_size`` bounds each client's requests in
flight: ``submit`` waits (reading answers meanwhile) while that many are unanswered.

A client writes each request straight into its own channel (no feeder thread, so no thread hand-off per
request); the server waits on every channel at once with one ``poll`` and never blocks on an answer: what a
channel cannot take now waits in that channel's outbox, so a client that is slow to read holds up only itself.
Messages use the framing of :meth:`multiprocessing.connection.Connection.send_bytes` (a 4-byte big-endian
length, or -1 and an 8-byte length), so either end reads them with ``recv_bytes``. Both ends poll before they
block (the idle server for 50 us, a waiting client for up to :data:`CLIENT_SPIN_S` while no other client of the
server polls): most of a small round trip would otherwise be two wake-ups.
"""

from __future__ import annotations

import collections
import itertools
import multiprocessing as mp
import pickle
import select
import socket
import threading
import time
import weakref

from tensordict import TensorDictBase

from ._shared import WAIT_SLICE, EndpointClaims, PeerStatus, Spinners, spin, wait_for
from .base import Batch, RequestReplyTransport, ResponseFuture, ServerEndpoint
from .config import TransportConfig
from .errors import PeerFailureError, RemoteError, ServiceError, TransportError
from .wire import frame, from_wire, rows_to_wire, to_wire

_OK, _ERR = 0, 1


CLIENT_SPIN_S = 200e-6
"""Seconds a waiting client polls its channel before it blocks, while no other client spins: about what a server
takes to read, serve and answer a small request, so its answer is read without a wake-up."""
_SEND_FLAGS = socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL


def _socket_of(conn, holder) -> socket.socket:
    """A socket object for non-blocking sends into ``conn``'s channel, closed when ``holder`` is collected.

    It holds a duplicate of ``conn``'s descriptor, so closing ``conn`` never leaves it pointing at a reused
    descriptor number; ``MSG_DONTWAIT`` leaves the shared file flags alone, so ``conn.recv_bytes`` keeps its
    blocking reads."""
    sock = socket.fromfd(conn.fileno(), socket.AF_UNIX, socket.SOCK_STREAM)
    weakref.finalize(holder, sock.close)
    return sock


class QueueTransport(RequestReplyTransport):
    """Request/reply across processes with pickled payloads.

    Args:
        max_clients: client endpoints (channels) this transport can hand out.
        max_queue_size: most requests in flight per client; ``submit`` waits while that many are unanswered.
        context: multiprocessing start method of the processes involved.
        name: the component served, named in its clients' errors.

    Example:
        >>> transport = QueueTransport(max_clients=8)
        >>> clients = [transport.client() for _ in range(4)]   # before spawning workers
    """

    kind = "queue"
    cross_process = True

    def __init__(self, max_clients: int = 32, max_queue_size: int = 1024, context: str = "spawn",
                 name: str = "service"):
        super().__init__()
        if max_clients < 1 or max_queue_size < 1:
            raise TransportError(f"max_clients and max_queue_size must be >= 1, got {max_clients} and {max_queue_size}")
        ctx = mp.get_context(context)
        self.max_clients, self.max_queue_size, self.context = max_clients, max_queue_size, context
        self.channels = [ctx.Pipe(duplex=True) for _ in range(max_clients)]  # (client end, server end)
        self.status = PeerStatus(name=name)
        self.claims = EndpointClaims(max_clients, ctx.Lock())
        self.spinners = Spinners(max_clients)
        self._next = 0

    @property
    def config(self) -> TransportConfig:
        return TransportConfig(self.kind, {"max_clients": self.max_clients, "max_queue_size": self.max_queue_size})

    def client(self) -> "QueueClient":
        if self._next >= self.max_clients:
            raise TransportError(f"all {self.max_clients} client endpoints are in use; raise max_clients")
        index, self._next = self._next, self._next + 1
        return QueueClient(index, self.channels[index][0], self.status, self.claims, self.max_queue_size,
                           self.spinners)

    def server(self) -> "QueueServer":
        return QueueServer([server_end for _, server_end in self.channels])

    def server_side(self) -> "QueueServerSide":
        return QueueServerSide([server_end for _, server_end in self.channels])

    def mark_serving(self, pid: int) -> None:
        self.status.set_serving(pid)

    def mark_dead(self, *, stopped: bool) -> None:
        self.status.set_dead(stopped)

    def _close(self) -> None:
        self.status.set_dead(stopped=True)
        for client_end, server_end in self.channels:
            client_end.close()
            server_end.close()
        self.status.close()
        self.claims.close()
        self.spinners.close()


class _QueueFuture(ResponseFuture):
    def __init__(self, client: "QueueClient", request_id: int):
        self.client, self.request_id = client, request_id

    def done(self) -> bool:
        return self.request_id in self.client._answers or self.client._receive(0.0, self.request_id)

    def result(self, timeout: float | None = None):
        c = self.client
        wait_for(lambda step: c._receive(step, self.request_id), c.status, timeout, f"{c.status.name} request")
        status, payload = c._answers.pop(self.request_id)
        if status == _ERR:
            raise payload
        return payload


class QueueClient:
    """The client of a :class:`QueueTransport`: ``submit(td)`` returns a future; threads may share it, processes
    may not (each process needs its own client: requests and answers use the client's own channel)."""

    def __init__(self, index: int, conn, status: PeerStatus, claims: EndpointClaims, max_in_flight: int,
                 spinners: Spinners):
        self.index, self.conn, self.status, self.claims = index, conn, status, claims
        self.max_in_flight, self.spinners = max_in_flight, spinners
        self._ids = itertools.count()
        self._answers: dict[int, tuple] = {}
        self._cond = threading.Condition()
        self._receiving = False
        self._in_flight = 0  # submitted and not yet read back
        self._write_lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._writable = None
        self._readable = None  # a poll object for the channel: cheaper than Connection.poll's selector per call

    def __getstate__(self):
        return {"index": self.index, "conn": self.conn, "status": self.status, "claims": self.claims,
                "max_in_flight": self.max_in_flight, "spinners": self.spinners}

    def __setstate__(self, state):
        self.__init__(**state)

    def submit(self, td: TensorDictBase) -> _QueueFuture:
        problem = self.status.problem(probe=False)
        if problem is not None:
            raise PeerFailureError(problem)
        self.claims.claim(self.index, "queue client endpoint")
        wire = to_wire(td)
        while self._in_flight >= self.max_in_flight:  # backpressure: read answers until there is room
            self._receive(WAIT_SLICE, None)
            problem = self.status.problem()
            if problem is not None:
                raise PeerFailureError(problem)
        with self._write_lock:  # ids and times in write order, so the server sees each thread's requests in order
            request_id = next(self._ids)
            pieces = frame(pickle.dumps((request_id, time.monotonic(), wire), protocol=pickle.HIGHEST_PROTOCOL))
            with self._cond:
                self._in_flight += 1
            self._send(pieces)
        return _QueueFuture(self, request_id)

    def _send(self, pieces: list) -> None:
        """Write whole ``pieces`` into the channel; while it is full, re-check that the server is alive."""
        if self._sock is None:
            self._sock = _socket_of(self.conn, self)
            self._writable = select.poll()
            self._writable.register(self.conn.fileno(), select.POLLOUT)
        sock = self._sock
        for piece in pieces:
            view, sent = memoryview(piece), 0
            while sent < len(view):
                try:
                    sent += sock.send(view[sent:], _SEND_FLAGS)
                except BlockingIOError:  # the server reads everything eventually (it never blocks on a client)
                    if not self._writable.poll(WAIT_SLICE * 1000):
                        problem = self.status.problem()
                        if problem is not None:
                            raise PeerFailureError(problem) from None
                except OSError as exc:
                    raise PeerFailureError(f"the queue channel to the server is closed ({exc})") from exc

    def _receive(self, step: float, request_id: int | None) -> bool:
        """Wait up to ``step`` s for answers (one thread reads the channel at a time); True once ours is there."""
        with self._cond:
            if request_id in self._answers:
                return True
            if self._receiving:
                self._cond.wait(step)
                return request_id in self._answers
            self._receiving = True
        try:
            if self._readable is None:
                self._readable = select.poll()
                self._readable.register(self.conn.fileno(), select.POLLIN)
            readable = self._readable.poll
            if readable(0) or (step > 0 and self.spinners.spin(self.index, lambda: bool(readable(0)), CLIENT_SPIN_S)) \
                    or readable(step * 1000):
                while True:
                    rid, status, payload = pickle.loads(self.conn.recv_bytes())
                    if status == _OK:
                        payload = from_wire(payload)
                    with self._cond:
                        self._answers[rid] = (status, payload)
                        self._in_flight -= 1
                    # Ours is here: stop (a poll costs more than the rest of a small answer; answers still in the
                    # channel are read by whoever waits for them). Else read on while there is more.
                    if rid == request_id or not self._readable.poll(0):
                        break
        except (EOFError, OSError):
            pass  # the peer check in wait_for turns this into a peer failure
        finally:
            with self._cond:
                self._receiving = False
                self._cond.notify_all()
        return request_id in self._answers


class QueueServerSide:
    """The server's share of a :class:`QueueTransport`: the server end of every channel."""

    def __init__(self, conns):
        self.conns = conns

    def server(self) -> "QueueServer":
        return QueueServer(self.conns)


class QueueServer(ServerEndpoint):
    """Waits on every channel with one ``poll``; reads one request per ready channel per sweep (so no client
    starves the others), serves them in submission order, and never blocks on an answer (see the outboxes)."""

    private_copies = True  # requests are decoded from bytes; answers are encoded to bytes

    def __init__(self, conns):
        self.conns = conns
        self._poller = select.poll()
        self._index = {}  # descriptor -> client index
        for i, conn in enumerate(conns):
            self._poller.register(conn.fileno(), select.POLLIN)
            self._index[conn.fileno()] = i
        self._socks: dict[int, socket.socket] = {}  # client index -> socket for non-blocking sends, made on first use
        self._outbox: dict[int, collections.deque] = {}  # client index -> bytes its channel could not take yet

    def _sweep(self, timeout: float, items: list, max_n: int) -> bool:
        """One ``poll``: flush outboxes that can move, read one request from each ready channel. Whether any
        channel had a request."""
        got = False
        for fd, events in self._poller.poll(max(0.0, timeout) * 1000):
            client = self._index[fd]
            if events & select.POLLOUT:
                self._flush(client)
            if len(items) >= max_n:
                continue
            if events & select.POLLIN:
                try:
                    request_id, enqueued, wire = pickle.loads(self.conns[client].recv_bytes())
                except (EOFError, OSError):  # the channel is gone: stop watching it
                    self._forget(fd)
                    continue
                items.append((enqueued, client, request_id, wire))
                got = True
            elif events & (select.POLLHUP | select.POLLERR | select.POLLNVAL):
                self._forget(fd)
        return got

    def _forget(self, fd: int) -> None:
        try:
            self._poller.unregister(fd)
        except (KeyError, ValueError):
            pass
        self._outbox.pop(self._index[fd], None)

    def collect(self, max_n: int, min_n: int, timeout: float, poll: float) -> Batch | None:
        items: list = []
        # Poll without blocking for a moment first: a client that asks again right after its answer is then
        # read without a wake-up, which can take longer than the whole serving pass on a small VM.
        if not (spin(lambda: self._sweep(0.0, items, max_n)) or self._sweep(poll, items, max_n)):
            return None
        while len(items) < max_n and self._sweep(0.0, items, max_n):  # take what is there
            pass
        if len(items) < min_n:
            deadline = time.monotonic() + timeout
            while len(items) < min_n:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._sweep(remaining, items, max_n)
        if len(items) > 1:
            items.sort(key=lambda item: item[0])  # submission order across clients (stable within one)
        return Batch(handles=[(client, rid) for _, client, rid, _ in items],
                     requests=[from_wire(wire) for _, _, _, wire in items], enqueued=[t for t, _, _, _ in items])

    def _send(self, client: int, message: tuple) -> None:
        payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        pieces = collections.deque(memoryview(piece) for piece in frame(payload))
        outbox = self._outbox.get(client)
        if outbox:  # keep the channel's order: behind what is already waiting
            outbox.extend(pieces)
        elif not self._push(client, pieces):  # the channel is full: the rest waits until the client reads
            self._outbox[client] = pieces
            self._watch(client, select.POLLIN | select.POLLOUT)

    def _push(self, client: int, pieces: collections.deque) -> bool:
        """Send ``pieces`` until they are gone (True; also when the client is gone) or the channel is full."""
        sock = self._socks.get(client)
        if sock is None:
            sock = self._socks[client] = _socket_of(self.conns[client], self)
        while pieces:
            view = pieces[0]
            try:
                sent = sock.send(view, _SEND_FLAGS)
            except BlockingIOError:
                return False
            except OSError:  # the client process is gone; nobody waits for these answers
                pieces.clear()
                return True
            if sent < len(view):
                pieces[0] = view[sent:]
                return False
            pieces.popleft()
        return True

    def _watch(self, client: int, events: int) -> None:
        try:
            self._poller.modify(self.conns[client].fileno(), events)
        except (KeyError, OSError, ValueError):
            pass  # a channel no longer watched (its client is gone)

    def _flush(self, client: int) -> None:
        outbox = self._outbox.get(client)
        if outbox is None or self._push(client, outbox):
            self._outbox.pop(client, None)
            self._watch(client, select.POLLIN)

    def reply(self, batch: Batch, out: TensorDictBase) -> None:
        for (client, rid), row in zip(batch.handles, rows_to_wire(out, len(batch))):
            self._send(client, (rid, _OK, row))

    def fail(self, batch: Batch, error: BaseException) -> None:
        if not isinstance(error, ServiceError):
            error = RemoteError.from_exception(error)
        for client, rid in batch.handles:
            self._send(client, (rid, _ERR, error))

    def close(self, reason: str = "the server was shut down", flush_timeout: float = 1.0) -> None:
        # Requests still waiting get a clear answer instead of waiting for the peer check; answers still in an
        # outbox get up to flush_timeout seconds (in all) to reach clients that are reading.
        error = PeerFailureError(reason)
        deadline = time.monotonic() + flush_timeout
        while True:
            items: list = []
            got = self._sweep(0.0 if not self._outbox else 0.01, items, len(self.conns))
            for _, client, rid, _ in items:
                self._send(client, (rid, _ERR, error))
            if (not got and not self._outbox) or time.monotonic() >= deadline:
                return
