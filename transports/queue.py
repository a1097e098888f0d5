"""``queue``: pickled TensorDicts over one local stream socket per client process (requests out, answers back).

Rules: the owner listens on a named local socket (Linux's abstract namespace: no file to leave behind; the server
accepts only processes of its own user, checked with ``SO_PEERCRED``). A client carries only that name and the
shared status block, so it pickles to any process of this machine (a ``Process`` argument, a pool, a Ray task, a
job step) and connects its own channel the first time it is used there: two processes never share a channel, and
threads of one process share their process's. Any picklable value may travel, non-tensor leaves included; layouts
may change between calls. ``max_queue_size`` bounds each client's requests in flight: ``submit`` waits (reading
answers meanwhile) while that many are unanswered.

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
import os
import pickle
import select
import socket
import struct
import threading
import time
import weakref
from multiprocessing.connection import Connection

from tensordict import TensorDictBase

from . import _shared
from ._shared import WAIT_SLICE, PeerStatus, Spinners, spin, wait_for
from .base import Batch, RequestReplyTransport, ResponseFuture, ServerEndpoint
from .config import TransportConfig
from .errors import PeerFailureError, RemoteError, ServiceError, TransportError
from .wire import frame, from_wire, rows_to_wire, to_wire

_OK, _ERR = 0, 1


CLIENT_SPIN_S = 200e-6
"""Seconds a waiting client polls its channel before it blocks, while no other client spins: about what a server
takes to read, serve and answer a small request, so its answer is read without a wake-up."""
_SEND_FLAGS = socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL
SPINNERS = 64
"""Entries of the block that tells waiting clients whether another client polls (a process takes entry pid % 64)."""
_CREDENTIALS = struct.Struct("3i")  # SO_PEERCRED: pid, uid, gid


def _listen(name: str) -> socket.socket:
    """A stream socket listening on abstract name ``name`` (gone with its last descriptor)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind("\0" + name)
    sock.listen(256)
    return sock


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
        max_queue_size: most requests in flight per client; ``submit`` waits while that many are unanswered.
        context: multiprocessing start method of the processes involved.
        name: the component served, named in its clients' errors.

    Example:
        >>> transport = QueueTransport()
        >>> client = transport.client()   # picklable: hand it to any process of this machine
    """

    kind = "queue"
    cross_process = True

    def __init__(self, max_queue_size: int = 1024, context: str = "spawn", name: str = "service"):
        super().__init__()
        if max_queue_size < 1:
            raise TransportError(f"max_queue_size must be >= 1, got {max_queue_size}")
        self.max_queue_size, self.context = max_queue_size, context
        # the owner listens (so clients may connect before the server runs: they wait in the backlog) and hands
        # the listening socket to the server's process as it starts
        self.address = f"rlsvc-queue-{os.getpid()}-{os.urandom(6).hex()}"
        self._listener = _listen(self.address)
        self.status = PeerStatus(name=name)
        self.spinners = Spinners(SPINNERS)

    @property
    def config(self) -> TransportConfig:
        return TransportConfig(self.kind, {"max_queue_size": self.max_queue_size})

    def client(self) -> "QueueClient":
        return QueueClient(self.address, self.status, self.max_queue_size, self.spinners)

    def server(self) -> "QueueServer":
        return QueueServer(self._listener)

    def server_side(self) -> "QueueServerSide":
        return QueueServerSide(self._listener)

    def mark_serving(self, pid: int) -> None:
        self.status.set_serving(pid)

    def mark_dead(self, *, stopped: bool) -> None:
        self.status.set_dead(stopped)

    def _close(self) -> None:
        self.status.set_dead(stopped=True)
        self._listener.close()  # the name is gone once the server's process let go of its copy too
        self.status.close()
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
    """The client of a :class:`QueueTransport`: ``submit(td)`` returns a future. Threads of a process share its
    channel; a copy in another process (pickled there, or inherited by ``fork``) connects a channel of its own
    the first time it is used."""

    def __init__(self, address: str, status: PeerStatus, max_in_flight: int, spinners: Spinners):
        self.address, self.status, self.max_in_flight, self.spinners = address, status, max_in_flight, spinners
        self._reset()

    def _reset(self) -> None:
        self.conn: Connection | None = None
        self._pid = None  # the process whose channel ``conn`` is
        self.index = os.getpid() % SPINNERS  # this process's entry in the spinners block
        self._ids = itertools.count()
        self._answers: dict[int, tuple] = {}
        self._cond = threading.Condition()
        self._receiving = False
        self._in_flight = 0  # submitted and not yet read back
        self._write_lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._writable = None
        self._readable = None  # a poll object for the channel: cheaper than Connection.poll's selector per call

    def __reduce__(self):
        return (QueueClient, (self.address, self.status, self.max_in_flight, self.spinners))

    def _connect(self) -> None:
        """Connect this process's channel (once per process; a copy inherited by ``fork`` connects anew)."""
        if self._pid is not None and self._pid != _shared._pid:  # inherited by fork: the channel stays the parent's
            self._reset()
        with self._write_lock:
            if self._pid == _shared._pid:
                return
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect("\0" + self.address)
            except OSError as exc:
                sock.close()
                raise PeerFailureError(self.status.problem() or f"the {self.status.name} server's socket does not "
                                       f"answer ({exc.strerror or exc})") from None
            self.conn, self._pid = Connection(sock.detach()), _shared._pid

    def submit(self, td: TensorDictBase) -> _QueueFuture:
        problem = self.status.problem(probe=False)
        if problem is not None:
            raise PeerFailureError(problem)
        if self._pid != _shared._pid:
            self._connect()
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
    """The server's share of a :class:`QueueTransport`: the listening socket (it travels to the server's process
    as that process starts)."""

    def __init__(self, listener: socket.socket):
        self.listener = listener

    def server(self) -> "QueueServer":
        return QueueServer(self.listener)


class QueueServer(ServerEndpoint):
    """Waits on the listening socket and every channel with one ``poll``; accepts new channels, reads one request
    per ready channel per sweep (so no client starves the others), serves them in submission order, and never
    blocks on an answer (see the outboxes)."""

    private_copies = True  # requests are decoded from bytes; answers are encoded to bytes

    def __init__(self, listener: socket.socket):
        self.listener = listener
        listener.setblocking(False)
        self.conns: dict[int, Connection] = {}  # client number -> its channel
        self._numbers = itertools.count()
        self._poller = select.poll()
        self._poller.register(listener.fileno(), select.POLLIN)
        self._index = {}  # descriptor -> client number
        self._socks: dict[int, socket.socket] = {}  # client number -> socket for non-blocking sends, made on first use
        self._outbox: dict[int, collections.deque] = {}  # client number -> bytes its channel could not take yet
        self._uid = os.getuid()

    def _accept(self) -> None:
        """Take every waiting connection of a process of this user (others are closed unread)."""
        while True:
            try:
                sock, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # the listener was closed under us
                return
            _, uid, _ = _CREDENTIALS.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                              _CREDENTIALS.size))
            if uid != self._uid:
                sock.close()
                continue
            sock.setblocking(True)
            conn, number = Connection(sock.detach()), next(self._numbers)
            self.conns[number] = conn
            self._index[conn.fileno()] = number
            self._poller.register(conn.fileno(), select.POLLIN)

    def _sweep(self, timeout: float, items: list, max_n: int) -> bool:
        """One ``poll``: flush outboxes that can move, read one request from each ready channel. Whether any
        channel had a request."""
        got = False
        for fd, events in self._poller.poll(max(0.0, timeout) * 1000):
            if fd == self.listener.fileno():
                self._accept()
                continue
            client = self._index.get(fd)
            if client is None:
                continue
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
        """Stop watching a channel whose client process is gone, and close it."""
        try:
            self._poller.unregister(fd)
        except (KeyError, ValueError):
            pass
        client = self._index.pop(fd, None)
        if client is None:
            return
        self._outbox.pop(client, None)
        sock = self._socks.pop(client, None)
        if sock is not None:
            sock.close()
        self.conns.pop(client).close()

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
        if client not in self.conns:
            return  # its process is gone: nobody waits for this answer
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
            got = self._sweep(0.0 if not self._outbox else 0.01, items, max(1, len(self.conns)))
            for _, client, rid, _ in items:
                self._send(client, (rid, _ERR, error))
            if (not got and not self._outbox) or time.monotonic() >= deadline:
                break
        self.listener.close()  # new connections are refused from now on
