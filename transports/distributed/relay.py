"""The rendezvous store off loopback: it stays on loopback, behind a relay that admits only peers holding the key.

torch's ``TCPStore`` accepts any connection and lets it write any key, and gloo trusts what the store says (the
addresses its pairs connect to). So where a ``distributed`` endpoint's ``host`` is not loopback, the store listens on
``127.0.0.1`` of the owner's machine only, and a `Relay` listens on ``host:port`` instead. Each connection
to the relay first proves the run's key (`transports.kernel.secret`: an HMAC challenge each way, fixed sizes,
a deadline); only then is it joined to the store, byte for byte. A peer without the key is closed after at most
``CHALLENGE_S`` seconds, having read nothing but the relay's nonce, and never reaches the store; a flood of such
peers is capped per address, so the real clients of another host still get in.

On the other side, a process that connects to such a store gets an `Entry`: a listener on its own loopback
that torch's store client connects to, each connection proven to the relay before it is joined to it.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections import Counter

from ..kernel.errors import PeerFailureError
from ..kernel.secret import ChallengeFailed, challenge_as_client, challenge_as_server

log = logging.getLogger(__name__)

CHALLENGE_S = 5.0
"""Seconds a peer has to prove the key before the relay closes its connection."""
PENDING_PER_PEER = 16
"""Connections one address may hold unproven at once; more are closed at once (a flood from one host does not keep
the others out)."""
PENDING = 256
"""Connections all peers together may hold unproven at once."""
CHUNK = 1 << 16


class NotAdmitted(PeerFailureError):
    """The relay answered but did not admit us: another key (or another program listens there). Not retried."""


def _join(a: socket.socket, b: socket.socket, name: str) -> None:
    """Copy bytes both ways between ``a`` and ``b`` until either side closes; then close both."""
    done = threading.Event()

    def copy(src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(CHUNK)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            if done.is_set():
                for s in (a, b):
                    s.close()
            else:
                done.set()
                for s in (a, b):
                    try:
                        s.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass

    threading.Thread(target=copy, args=(a, b), name=f"{name}-up", daemon=True).start()
    threading.Thread(target=copy, args=(b, a), name=f"{name}-down", daemon=True).start()


class Relay:
    """Listens on ``host:port`` (``port`` 0: a free one) and joins each connection that proves ``key`` to the
    store at ``127.0.0.1:target``.

    Attributes:
        port: the port it listens on.
        refused: connections closed so far without reaching the store (no key, a wrong one, silence, a flood).
    """

    def __init__(self, host: str, port: int, target: int, key: bytes, name: str):
        self.host, self.target, self._key, self.name = host, target, key, name
        self._sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._sock.bind((host, port))
            self._sock.listen(512)
        except OSError:
            self._sock.close()
            raise
        self.port = self._sock.getsockname()[1]
        self.refused = 0
        self._pending: Counter = Counter()
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, name=f"{name}-relay", daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, (peer, *_) = self._sock.accept()
            except OSError:
                return  # closed
            with self._lock:
                full = self._pending[peer] >= PENDING_PER_PEER or sum(self._pending.values()) >= PENDING
                if not full:
                    self._pending[peer] += 1
            if full:
                self._refuse(conn, peer, "too many unproven connections from it")
                continue
            threading.Thread(target=self._admit, args=(conn, peer), name=f"{self.name}-challenge",
                             daemon=True).start()

    def _admit(self, conn: socket.socket, peer: str) -> None:
        try:
            challenge_as_server(conn, self._key, CHALLENGE_S)
        except (ChallengeFailed, OSError) as exc:
            self._refuse(conn, peer, str(exc))
            return
        finally:
            with self._lock:
                self._pending[peer] -= 1
                if not self._pending[peer]:
                    del self._pending[peer]
        try:
            store = socket.create_connection(("127.0.0.1", self.target), timeout=CHALLENGE_S)
            store.settimeout(None)
        except OSError:
            conn.close()  # the store is gone: the owner shut down
            return
        _join(conn, store, self.name)

    def _refuse(self, conn: socket.socket, peer: str, why: str) -> None:
        conn.close()
        with self._lock:
            self.refused += 1
            first = self.refused == 1 or self.refused % 100 == 0
        if first and not self._closed:
            log.warning("%s: refused a connection from %s to %s:%d: %s (%d refused so far)", self.name, peer, self.host,
                        self.port, why, self.refused)

    def close(self) -> None:
        """Stop listening (connections already joined end when the store closes them)."""
        self._closed = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()


class Entry:
    """This process's way into the relay at ``host:port``: a listener on loopback whose connections are each
    proven to the relay and joined to it. The first connection is proven at once, so a wrong key or a relay that is
    not there fails here, with a reason, rather than in torch's store client."""

    def __init__(self, host: str, port: int, key: bytes, timeout: float, what: str):
        self.host, self.port_there, self._key, self._timeout, self.what = host, port, key, timeout, what
        self._spare: socket.socket | None = self._dial()
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        threading.Thread(target=self._accept, name="rlsvc-entry", daemon=True).start()

    def _dial(self) -> socket.socket:
        try:
            sock = socket.create_connection((self.host, self.port_there), timeout=self._timeout)
        except OSError as exc:
            raise PeerFailureError(f"{self.what}: no rendezvous store answers at {self.host}:{self.port_there} "
                                   f"({type(exc).__name__})") from None
        try:
            challenge_as_client(sock, self._key, min(self._timeout, 2 * CHALLENGE_S))
        except (ChallengeFailed, OSError) as exc:
            sock.close()
            raise NotAdmitted(f"{self.what}: the rendezvous store at {self.host}:{self.port_there} did not "
                              f"admit us: {exc}") from None
        return sock

    def _accept(self) -> None:
        while True:
            try:
                local, _ = self._sock.accept()
            except OSError:
                return
            remote, self._spare = self._spare, None
            try:
                remote = remote or self._dial()
            except PeerFailureError as exc:
                log.warning("%s", exc)
                local.close()
                continue
            _join(local, remote, "rlsvc-entry")


_ENTRIES: dict[tuple[int, str, int], Entry] = {}
_ENTRIES_LOCK = threading.Lock()


def entry(host: str, port: int, key: bytes, timeout: float, what: str) -> int:
    """The loopback port of this process's `Entry` to the relay at ``host:port`` (made on first use).

    Raises:
        PeerFailureError: nothing answers there within ``timeout`` (retried until then: the owner may be starting).
        NotAdmitted: it does not admit our key (at once).
    """
    with _ENTRIES_LOCK:
        k = (os.getpid(), host, port)
        if k not in _ENTRIES:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    _ENTRIES[k] = Entry(host, port, key, max(0.1, deadline - time.monotonic()), what)
                    break
                except NotAdmitted:
                    raise
                except PeerFailureError:
                    if time.monotonic() >= deadline:
                        raise
                    time.sleep(0.1)
        return _ENTRIES[k].port
