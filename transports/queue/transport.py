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
Messages use the framing of `multiprocessing.connection.Connection.send_bytes` (a 4-byte big-endian
length, or -1 and an 8-byte length), so either end reads them with ``recv_bytes``. Both ends poll before they
block (the idle server for 50 us, a waiting client for up to `CLIENT_SPIN_S` while no other client of the
server polls): most of a small round trip would otherwise be two wake-ups.
"""

from __future__ import annotations

import itertools
import os
import pickle
import select
import socket
import threading
import time
from multiprocessing.connection import Connection

from tensordict import TensorDictBase

from .. import _shared
from .server import ERR as _ERR, OK as _OK, SEND_FLAGS as _SEND_FLAGS, QueueServer, QueueServerSide, \
    socket_of as _socket_of
from .._shared import WAIT_SLICE, PeerStatus, Spinners, wait_for
from ..base import RequestReplyTransport, ResponseFuture
from ..descriptor import QUEUE, QueueOptions
from ..kernel.errors import PeerFailureError, TransportError
from .wire import frame, from_wire, to_wire

CLIENT_SPIN_S = 200e-6
"""Seconds a waiting client polls its channel before it blocks, while no other client spins: about what a server
takes to read, serve and answer a small request, so its answer is read without a wake-up."""
SPINNERS = 64
"""Entries of the block that tells waiting clients whether another client polls (a process takes entry pid % 64)."""


def _listen(name: str) -> socket.socket:
    """A stream socket listening on abstract name ``name`` (gone with its last descriptor)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind("\0" + name)
    sock.listen(256)
    return sock


class QueueTransport(RequestReplyTransport):
    """Request/reply across processes with pickled payloads.

    Args:
        max_queue_size: most requests in flight per client; ``submit`` waits while that many are unanswered.
        context: multiprocessing start method of the processes involved.
        name: the component served, named in its clients' errors.

    Examples:
        >>> transport = QueueTransport()
        >>> client = transport.client()   # picklable: hand it to any process of this machine
    """

    descriptor = QUEUE

    def __init__(self, max_queue_size: int = QueueOptions.max_queue_size, context: str = QueueOptions.context,
                 name: str = "service"):
        super().__init__()
        if max_queue_size < 1:
            raise TransportError(f"max_queue_size must be >= 1, got {max_queue_size}")
        self.options = QueueOptions(max_queue_size, context)
        self.max_queue_size, self.context = max_queue_size, context
        # the owner listens (so clients may connect before the server runs: they wait in the backlog) and hands
        # the listening socket to the server's process as it starts
        self.address = f"rlsvc-queue-{os.getpid()}-{os.urandom(6).hex()}"
        self._listener = _listen(self.address)
        self.status = PeerStatus(name=name)
        self.spinners = Spinners(SPINNERS)

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
    """The client of a `QueueTransport`: ``submit(td)`` returns a future. Threads of a process share its
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
        # inherited by fork: the channel stays the parent's
        if self._pid is not None and self._pid != _shared.current_pid():
            self._reset()
        with self._write_lock:
            if self._pid == _shared.current_pid():
                return
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect("\0" + self.address)
            except OSError as exc:
                sock.close()
                raise PeerFailureError(self.status.problem() or f"the {self.status.name} server's socket does not "
                                       f"answer ({exc.strerror or exc})") from None
            self.conn, self._pid = Connection(sock.detach()), _shared.current_pid()

    def submit(self, td: TensorDictBase) -> _QueueFuture:
        """Send ``td`` to the server (connecting this process's channel on first use).

        Waits while ``max_queue_size`` requests of this client are unanswered.

        Returns:
            The future of the answer.

        Raises:
            PeerFailureError: the server is gone or its socket does not answer.
        """
        problem = self.status.problem(probe=False)
        if problem is not None:
            raise PeerFailureError(problem)
        if self._pid != _shared.current_pid():
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
