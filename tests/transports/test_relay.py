"""The key challenge and the relay in front of an off-loopback rendezvous store, in this process: real sockets, a
real TCPStore behind the relay. (Across network namespaces, from a host without the key: tests/hosts.)"""

from __future__ import annotations

import datetime
import socket
import threading
import time

import pytest

from transports.distributed import relay as relay_module
from transports.distributed.gloo import check_options, local_address
from transports.distributed.relay import Entry, NotAdmitted, Relay, entry
from transports.kernel.errors import ConfigurationError, PeerFailureError
from transports.kernel.secret import (HELLO, KEY_VARIABLE, NONCE, ChallengeFailed, challenge_as_client,
                                      challenge_as_server, is_loopback, shared_key)

from tests.helpers import wait_until

KEY, OTHER = b"k" * 32, b"o" * 32


def challenged(server_key: bytes, client_key: bytes):
    """Run both sides of the challenge over a socket pair; what each side raised (``None``: it passed)."""
    a, b = socket.socketpair()
    results = {}

    def side(name, fn, sock, key):
        try:
            fn(sock, key, 2.0)
            results[name] = None
        except ChallengeFailed as exc:
            results[name] = exc
        finally:
            sock.close()  # as the relay does: a refused peer's connection is closed

    threads = [threading.Thread(target=side, args=("server", challenge_as_server, a, server_key)),
               threading.Thread(target=side, args=("client", challenge_as_client, b, client_key))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    return results["server"], results["client"]


def test_the_same_key_passes_both_ways_and_another_fails_both():
    assert challenged(KEY, KEY) == (None, None)
    server, client = challenged(KEY, OTHER)
    assert "does not hold the key" in str(server)
    assert "refused our key" in str(client) and KEY_VARIABLE in str(client)


def test_a_server_speaking_something_else_is_named():
    a, b = socket.socketpair()
    a.sendall(b"HTTP/1.1 200 OK\r\n" + b"x" * 64)
    with pytest.raises(ChallengeFailed, match="does not speak this challenge"):
        challenge_as_client(b, KEY, 2.0)
    a.close(), b.close()


def test_loopback_and_the_key_variable(monkeypatch):
    assert is_loopback("127.0.0.1") and is_loopback("127.3.2.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("10.0.0.1") and not is_loopback("node-a")
    monkeypatch.delenv(KEY_VARIABLE, raising=False)
    with pytest.raises(ConfigurationError, match=KEY_VARIABLE) as err:
        shared_key("something", "a.path")
    assert err.value.path == "a.path"
    monkeypatch.setenv(KEY_VARIABLE, "s")
    assert len(shared_key("something", "a.path")) == 32


def test_planning_refuses_a_wildcard_host_and_a_missing_key_off_loopback(monkeypatch):
    monkeypatch.delenv(KEY_VARIABLE, raising=False)
    check_options({"host": "127.0.0.1"})  # loopback needs no key
    for wildcard in ("0.0.0.0", "::"):
        with pytest.raises(ConfigurationError, match="every address") as err:
            check_options({"host": wildcard}, path="components.inference.transport_options")
        assert err.value.path == "components.inference.transport_options.host"
    with pytest.raises(ConfigurationError, match=KEY_VARIABLE) as err:
        check_options({"host": "10.1.2.3"}, path="components.inference.transport_options")
    assert err.value.path == "components.inference.transport_options.host"
    monkeypatch.setenv(KEY_VARIABLE, "s")
    check_options({"host": "10.1.2.3"})


def test_a_process_listens_for_its_peer_on_its_own_address_towards_it():
    assert local_address("127.0.0.1") == "127.0.0.1"
    # no other interface is needed to ask the routing table: loopback's other addresses route through lo
    assert local_address("127.0.0.2") == "127.0.0.2"


def closed_without_answer(sock: socket.socket) -> bool:
    """Whether the peer closed ``sock`` without sending anything more (a reset, where our bytes were left unread)."""
    try:
        return sock.recv(100) == b""
    except ConnectionResetError:
        return True


@pytest.fixture
def store_behind_relay():
    """A real TCPStore on loopback and a relay in front of it (on another loopback port: the relay does not care
    which address it listens on; tests/hosts puts it on a namespace's own)."""
    from torch.distributed import TCPStore

    store = TCPStore("127.0.0.1", 0, None, True, timeout=datetime.timedelta(seconds=10), wait_for_workers=False)
    relay = Relay("127.0.0.1", 0, store.port, KEY, "test")
    yield store, relay
    relay.close()


def test_a_peer_with_the_key_reaches_the_store_and_one_without_never_does(store_behind_relay):
    from torch.distributed import TCPStore

    store, relay = store_behind_relay
    port = Entry("127.0.0.1", relay.port, KEY, 5.0, "test").port
    client = TCPStore("127.0.0.1", port, None, False, timeout=datetime.timedelta(seconds=5))
    client.set("written", "by a peer with the key")
    assert store.get("written") == b"by a peer with the key"
    with pytest.raises(PeerFailureError, match="did not admit us"):
        Entry("127.0.0.1", relay.port, OTHER, 5.0, "test")
    started = time.monotonic()
    with pytest.raises(NotAdmitted):  # at once, not retried until the timeout as a relay not listening yet is
        entry("127.0.0.1", relay.port, OTHER, 30.0, "test")
    assert time.monotonic() - started < 10
    wait_until(lambda: relay.refused == 2, timeout=10, what="the wrong key is refused")
    # garbage, or a store client speaking torch's protocol straight at the relay: refused, nothing written
    raw = socket.create_connection(("127.0.0.1", relay.port))
    assert raw.recv(len(HELLO) + NONCE).startswith(HELLO)
    raw.sendall(b"\x00garbage" * 100)
    assert closed_without_answer(raw)
    raw.close()
    wait_until(lambda: relay.refused == 3, timeout=10, what="garbage is refused")
    assert client.num_keys() == store.num_keys()  # (no key was added behind our back)
    assert client.get("written") == b"by a peer with the key"  # the admitted client goes on


def test_a_flood_of_silent_connections_is_capped_and_the_key_still_gets_in(store_behind_relay, monkeypatch):
    from torch.distributed import TCPStore

    store, relay = store_behind_relay
    monkeypatch.setattr(relay_module, "PENDING_PER_PEER", 4)
    silent = [socket.create_connection(("127.0.0.1", relay.port)) for _ in range(12)]
    try:
        wait_until(lambda: relay.refused == 8, timeout=10, what="connections past the cap are closed at once")
    finally:
        for s in silent:
            s.close()
    wait_until(lambda: relay.refused == 12, timeout=10, what="the silent connections are let go")
    port = Entry("127.0.0.1", relay.port, KEY, 5.0, "test").port
    TCPStore("127.0.0.1", port, None, False, timeout=datetime.timedelta(seconds=5)).set("after", "the flood")
    assert store.get("after") == b"the flood"
