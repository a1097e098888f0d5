"""The serving side of ``queue`` (see `transports.queue.transport`): one ``poll`` over the listening socket and
every channel, admission of same-user processes only, and outboxes so the server never blocks on a slow reader."""

from __future__ import annotations

import collections
import itertools
import os
import pickle
import select
import socket
import struct
import time
from multiprocessing.connection import Connection

from tensordict import TensorDictBase

from .._shared import AdaptiveSpin
from ..base import Batch, ServerEndpoint
from ..kernel.errors import PeerFailureError, RemoteError, ServiceError
from .wire import frame, from_wire, rows_to_wire

OK, ERR = 0, 1
SEND_FLAGS = socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL
_CREDENTIALS = struct.Struct("3i")  # SO_PEERCRED: pid, uid, gid


def socket_of(conn, holder) -> socket.socket:
    """A socket object for non-blocking sends into ``conn``'s channel, closed when ``holder`` is collected.

    It holds a duplicate of ``conn``'s descriptor, so closing ``conn`` never leaves it pointing at a reused
    descriptor number; ``MSG_DONTWAIT`` leaves the shared file flags alone, so ``conn.recv_bytes`` keeps its
    blocking reads."""
    import weakref

    sock = socket.fromfd(conn.fileno(), socket.AF_UNIX, socket.SOCK_STREAM)
    weakref.finalize(holder, sock.close)
    return sock


class QueueServerSide:
    """The server's share of a `QueueTransport`: the listening socket (it travels to the server's process
    as that process starts)."""

    def __init__(self, listener: socket.socket):
        self.listener = listener

    def server(self) -> "QueueServer":
        """Build the serving endpoint over the listening socket; call it in the serving process."""
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
        self._spin = AdaptiveSpin()

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
        if not self._spin.wait(lambda: self._sweep(0.0, items, max_n), lambda: self._sweep(poll, items, max_n)):
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
            sock = self._socks[client] = socket_of(self.conns[client], self)
        while pieces:
            view = pieces[0]
            try:
                sent = sock.send(view, SEND_FLAGS)
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
            self._send(client, (rid, OK, row))

    def fail(self, batch: Batch, error: BaseException) -> None:
        if not isinstance(error, ServiceError):
            error = RemoteError.from_exception(error)
        for client, rid in batch.handles:
            self._send(client, (rid, ERR, error))

    def close(self, reason: str = "the server was shut down", flush_timeout: float = 1.0) -> None:
        # Requests still waiting get a clear answer instead of waiting for the peer check; answers still in an
        # outbox get up to flush_timeout seconds (in all) to reach clients that are reading.
        error = PeerFailureError(reason)
        deadline = time.monotonic() + flush_timeout
        while True:
            items: list = []
            got = self._sweep(0.0 if not self._outbox else 0.01, items, max(1, len(self.conns)))
            for _, client, rid, _ in items:
                self._send(client, (rid, ERR, error))
            if (not got and not self._outbox) or time.monotonic() >= deadline:
                break
        self.listener.close()  # new connections are refused from now on
