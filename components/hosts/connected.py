"""Hosts whose target runs in a process this machine did not start, which connects back over TCP.

A submitit job (`components.hosts.submitit`) or a rank started by ``torchrun`` / ``srun``
(`components.hosts.distributed`) dials the host's listening socket and both sides prove they hold the same key with the
HMAC challenge of `multiprocessing.connection`, each challenging the other: nothing either side receives is unpickled
before that. Then the peer runs the control loop of a ``process`` child (the driver's calls by message, the answers
back). A peer whose connection closes (a crash, a kill) or falls silent (its node or the link to it lost: see
`LOST_AFTER_S`) is a peer failure; ``stop`` asks by message and waits for the peer to close its end.
"""

from __future__ import annotations

import logging
import os
import select
import socket
import struct
import time
from multiprocessing.connection import Connection, answer_challenge, deliver_challenge
from typing import Callable

from transports.kernel.errors import PeerFailureError, ServiceTimeoutError

from .base import DEFAULT_STOP_TIMEOUT
from .child import receive, send
from .process import ProcessHost

log = logging.getLogger(__name__)

HANDSHAKE_S = 10.0
"""Seconds a connecting peer has to answer the challenge before it is dropped (and the next one is awaited)."""


class ConnectedHost(ProcessHost):
    """Serves the target through a peer that connects to `_server` and authenticates with `_key`.

    Subclasses bind `_server` in ``_launch``, and say how the peer is lost (``_lost``), whether it ended
    before connecting (``_gone``) and how to make it end (``_force_stop``).
    """

    shares_memory = False  # the peer may run on another node

    def __init__(self, *args, **kwargs):
        ProcessHost.__init__(self, *args, **kwargs)  # not a sibling's (a local rank's environment wrapper)
        self._server: socket.socket | None = None
        self._peer: socket.socket | None = None  # the connection's socket, kept to notice its end
        self._key = b""
        self._peer_address: str | None = None

    def _gone(self) -> str | None:
        """Why no peer will connect any more (its job ended...), or ``None`` while one may."""
        return None

    def _accept(self, deadline: float, waiting: Callable[[], str]) -> tuple[Connection, socket.socket]:
        """The peer's authenticated connection: peers that fail the challenge are dropped and the next awaited; a
        peer that can no longer come (``_gone``), or none by ``deadline``, raises (``waiting()``: what was awaited, in
        words, for the timeout's message)."""
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ServiceTimeoutError(f"{self.name}: {waiting()}")
            readable, _, _ = select.select([self._server], [], [], min(2.0, remaining))
            if not readable:
                gone = self._gone()
                if gone is not None:
                    raise PeerFailureError(gone)
                continue
            sock, _ = self._server.accept()
            timeouts(sock, HANDSHAKE_S)
            peer = sock.dup()
            conn = Connection(sock.detach())
            try:
                deliver_challenge(conn, self._key)
                answer_challenge(conn, self._key)
            except Exception as exc:  # noqa: BLE001 - a stranger, or a peer too slow to answer: drop it, keep waiting
                log.warning("%s: dropped a connection that failed the challenge (%s)", self.name, exc)
                conn.close()
                peer.close()
                continue
            timeouts(peer, 0.0)
            keep_alive(peer)
            self._peer_address = peer.getpeername()[0]
            return conn, peer

    def _connect(self, deadline: float, waiting: Callable[[], str], send: bytes | None = None) -> None:
        """Accept the peer (see `_accept`), send it ``send`` if given, then wait for it to be ready (see
        `_ready`); a peer lost meanwhile is a peer failure, and whatever fails makes it end."""
        try:
            self._conn, self._peer = self._accept(deadline, waiting)
            if send is not None:
                self._conn.send_bytes(send)
        except ServiceTimeoutError:  # before OSError: it is a TimeoutError
            self._force_stop(0.0)
            raise
        except OSError:
            self._force_stop(0.0)
            raise PeerFailureError(self._lost(" during startup")) from None
        self._ready(" during startup")

    def _ready(self, before: str) -> None:
        """After the connection: wait for the peer's ready handshake (``resources.startup_timeout``) and start
        watching it; a build error is raised as the peer reported it, a lost peer as a peer failure."""
        try:
            timeout = self.resources.startup_timeout
            if not self._conn.poll(timeout):
                raise ServiceTimeoutError(f"{self.name}: connected, but not ready within {timeout:g} s "
                                          "(resources.startup_timeout)")
            kind, value = receive(self._conn)
        except ServiceTimeoutError:  # before OSError: it is a TimeoutError
            self._force_stop(0.0)
            raise
        except (EOFError, OSError):
            kind, value = "died", None
        if kind == "ready":
            self._start_watcher()
            return
        self._force_stop(2.0 if kind == "error" else 0.0)  # a peer whose target failed to build ends by itself
        if kind == "error":
            raise value
        raise PeerFailureError(self._lost(before))

    # ------------------------------------------------------------------ watching
    def _watch(self) -> None:
        peer, wake = self._peer, self._wake_r
        while True:
            readable, _, _ = select.select([peer, wake], [], [])
            if wake in readable:
                return
            if self._busy.locked():  # an answer is on its way: its reader notices an end itself
                time.sleep(0.05)
                continue
            try:
                data = peer.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if not data:
                if not self._stopping:
                    self._died(self._lost())
                return
            time.sleep(0.05)  # an answer nobody has asked for yet

    def _peer_alive(self) -> bool:
        return self.death is None and self._conn is not None

    # ------------------------------------------------------------------ stop
    def begin_shutdown(self) -> None:
        if self._stopping:
            return
        self._stopping = True
        if self._conn is not None:
            try:
                send(self._conn, ("stop", None))
            except (OSError, ValueError):
                pass

    def shutdown(self, timeout: float | None = None) -> None:
        if not self._launched or self._server is None:
            return
        timeout = DEFAULT_STOP_TIMEOUT if timeout is None else timeout
        deadline = time.monotonic() + timeout
        self.begin_shutdown()
        connected = self._conn is not None
        if connected:  # the peer closes its end once its target closed
            try:
                while self._conn.poll(max(0.0, 0.6 * (deadline - time.monotonic()))):
                    self._conn.recv_bytes()  # an answer nobody will read
            except (EOFError, OSError):
                pass
        self._force_stop(max(0.5, deadline - time.monotonic()) if connected else 0.0)  # unconnected: nothing to wait for
        self._stop_watcher()
        for closable in (self._conn, self._peer, self._server):
            if closable is not None:
                closable.close()
        self._conn = self._peer = self._server = None

    # ------------------------------------------------------------------ introspection
    @property
    def is_alive(self) -> bool:
        return self._conn is not None and self.death is None and not self._stopping

    @property
    def pid(self) -> int | None:
        return None  # not a process this host started

    @property
    def node_address(self) -> str | None:
        """The address the peer connected from (its node's, as this host sees it)."""
        return self._peer_address


LOST_AFTER_S = 20
"""Seconds of silence after which a connection to a peer on another host counts as lost (its node, or the link to
it, went away without closing anything): TCP keep-alive probes an idle connection from 5 s on, every 3 s, five
times; data left unacknowledged that long ends it too (``TCP_USER_TIMEOUT``)."""


def keep_alive(sock: socket.socket | int) -> None:
    """Have the kernel end ``sock`` (a socket or its descriptor) once its peer has been silent
    `LOST_AFTER_S` seconds, idle or not: a read or write on it then fails, where it would wait forever."""
    target = socket.socket(fileno=os.dup(sock)) if isinstance(sock, int) else sock  # a dup: the same connection
    target.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option, value in (("TCP_KEEPIDLE", 5), ("TCP_KEEPINTVL", 3), ("TCP_KEEPCNT", 5),
                          ("TCP_USER_TIMEOUT", LOST_AFTER_S * 1000)):
        if hasattr(socket, option):
            target.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)
    if target is not sock:
        target.close()  # the descriptor we were given stays open


def timeouts(sock: socket.socket, seconds: float) -> None:
    """Blocking reads and writes on ``sock`` give up after ``seconds`` (0: never), without making it non-blocking."""
    whole = int(seconds)
    value = struct.pack("ll", whole, int((seconds - whole) * 1e6))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, value)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, value)
