"""The run's shared secret, and the challenge that proves a peer holds it.

Every connection that leaves loopback proves the secret in ``RLSVC_KEY`` before anything else is read from it:
worker ranks dialing their driver (``distributed.ranks=env``), and every connection to a ``distributed`` transport's
rendezvous store that listens on an address other than loopback (through `transports.distributed.relay`).
Each side sends a fresh nonce and answers the other's with an HMAC-SHA256 of it under the key, so neither the key
nor a reusable answer crosses the network, and a peer without the key learns nothing but the server's nonce.
The secret is read from the environment of each process (set it on every node); it never travels in a pickle.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import socket
import time

from .errors import ConfigurationError

KEY_VARIABLE = "RLSVC_KEY"
"""The environment variable holding the run's shared secret (the same on every node)."""
HELLO = b"rlsvc-challenge-1\n"
"""What a server sends first, before its nonce: a peer speaking something else fails at once."""
NONCE = 32
MAC = hashlib.sha256().digest_size


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine's loopback only (``127.0.0.0/8``, ``::1``, ``localhost``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def shared_key(needed_by: str, path: str) -> bytes:
    """The run's secret from ``RLSVC_KEY``, as the challenge's key (its SHA-256, so any length of secret serves).

    Args:
        needed_by: what needs it, for the message (``"distributed.ranks=env"``).
        path: the configuration key to blame when it is missing.

    Raises:
        ConfigurationError: the variable is not set, or empty.
    """
    secret = os.environ.get(KEY_VARIABLE, "")
    if not secret:
        raise ConfigurationError(f"{needed_by}: set {KEY_VARIABLE} to the same secret in the environment of every "
                                 f"node's processes (e.g. export {KEY_VARIABLE}=$(openssl rand -hex 32)): peers off "
                                 "loopback prove they hold it before anything is exchanged", path=path)
    return hashlib.sha256(secret.encode()).digest()


class ChallengeFailed(ConnectionError):
    """The peer did not prove the key (a wrong key, another protocol, silence past the deadline, a closed socket)."""


def _mac(key: bytes, role: bytes, mine: bytes, theirs: bytes) -> bytes:
    return hmac.new(key, role + mine + theirs, hashlib.sha256).digest()


def _read(sock: socket.socket, n: int, deadline: float) -> bytes:
    data = b""
    while len(data) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise ChallengeFailed("the peer did not answer the challenge in time")
        sock.settimeout(left)
        try:
            chunk = sock.recv(n - len(data))
        except socket.timeout:
            raise ChallengeFailed("the peer did not answer the challenge in time") from None
        if not chunk:
            raise ChallengeFailed("the peer closed the connection during the challenge")
        data += chunk
    return data


def challenge_as_server(sock: socket.socket, key: bytes, timeout: float) -> None:
    """Prove ``key`` to the peer that connected to us and have it prove the key first; reads exactly
    ``NONCE + MAC`` bytes from it, whatever it sends.

    Raises:
        ChallengeFailed: the peer did not prove the key within ``timeout`` seconds (we then sent nothing but our
            nonce).
    """
    deadline = time.monotonic() + timeout
    nonce = os.urandom(NONCE)
    sock.settimeout(timeout)
    sock.sendall(HELLO + nonce)
    answer = _read(sock, NONCE + MAC, deadline)
    theirs, mac = answer[:NONCE], answer[NONCE:]
    if not hmac.compare_digest(mac, _mac(key, b"client", nonce, theirs)):
        raise ChallengeFailed("the peer does not hold the key")
    sock.sendall(_mac(key, b"server", theirs, nonce))
    sock.settimeout(None)


def challenge_as_client(sock: socket.socket, key: bytes, timeout: float) -> None:
    """Prove ``key`` to the server we connected to, and have it prove the key back.

    Raises:
        ChallengeFailed: the server speaks another protocol, does not hold the key, or is silent past ``timeout``.
    """
    deadline = time.monotonic() + timeout
    hello = _read(sock, len(HELLO) + NONCE, deadline)
    if not hello.startswith(HELLO):
        raise ChallengeFailed("the server does not speak this challenge (another program listens there)")
    theirs, nonce = hello[len(HELLO):], os.urandom(NONCE)
    sock.sendall(nonce + _mac(key, b"client", theirs, nonce))
    try:
        mac = _read(sock, MAC, deadline)
    except ChallengeFailed:
        raise ChallengeFailed(f"the server refused our key (is {KEY_VARIABLE} the same on every node?)") from None
    if not hmac.compare_digest(mac, _mac(key, b"server", nonce, theirs)):
        raise ChallengeFailed("the server does not hold the key")
    sock.settimeout(None)
