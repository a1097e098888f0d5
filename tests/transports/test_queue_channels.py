"""The ``queue`` transport's channels: framing, outboxes, backpressure and peer failure while a channel is full.

A real inference server in a child process; requests large enough (1 MiB) to fill a local socket's buffer.
"""

import contextlib
import os
import signal
import threading
import time
from functools import partial

import pytest
import torch
from tensordict import TensorDict

from components.errors import PeerFailureError
from components.inference import InferenceServer, InferenceServerConfig
from transports.config import TransportConfig
from transports.queue.wire import frame

from tests.factories import echo_factory
from tests.helpers import wait_until

BIG = 1 << 18  # float32 elements: 1 MiB per request and per answer


def big(value: float) -> TensorDict:
    return TensorDict({"observation": torch.full((BIG,), float(value))})


def small(value: float) -> TensorDict:
    return TensorDict({"observation": torch.full((4,), float(value))})


def queue_server(delay: float = 0.0, **options) -> InferenceServer:
    return InferenceServer(InferenceServerConfig(placement="process", max_batch_size=1),
                           policy_factory=partial(echo_factory, delay), transport=TransportConfig("queue", options))


@pytest.mark.parametrize("n", [0, 10, (1 << 16) - 5, 1 << 16, (1 << 16) + 1, 3 << 20])
def test_frames_are_what_recv_bytes_reads(n):
    import multiprocessing as mp

    a, b = mp.Pipe(duplex=True)
    payload = os.urandom(n)
    writer = threading.Thread(target=lambda: [_write(a, piece) for piece in frame(payload)])
    try:
        writer.start()  # a big frame only fits while the other end reads
        assert b.recv_bytes() == payload
        writer.join(10)
        assert not writer.is_alive()
    finally:
        a.close()
        b.close()


def _write(conn, piece: bytes) -> None:
    view = memoryview(piece)
    while view:
        view = view[os.write(conn.fileno(), view):]


def test_a_client_that_does_not_read_holds_up_only_itself():
    with queue_server() as owner:
        slow, fast = owner.client(), owner.client()
        pending = [slow.submit(big(i)) for i in range(6)]  # 6 MiB of answers nobody reads yet
        for i in range(20):
            assert fast.submit(small(i)).result(timeout=10)["action"].tolist() == [2.0 * i] * 4
        for i, future in enumerate(pending):  # nothing was lost while they waited in the server's outbox
            action = future.result(timeout=10)["action"]
            assert action.shape == (BIG,) and bool((action == 2.0 * i).all())


def test_one_thread_may_submit_many_large_requests_before_reading():
    with queue_server() as owner:
        client = owner.client()
        futures = [client.submit(big(i)) for i in range(8)]
        for i, future in enumerate(futures):
            assert bool((future.result(timeout=10)["action"] == 2.0 * i).all())


def test_max_queue_size_bounds_each_clients_requests_in_flight():
    with queue_server(delay=0.2, max_queue_size=1) as owner:
        client = owner.client()
        first = client.submit(small(1))
        second = client.submit(small(2))  # returns only once there is room: the first answer has been read
        assert first.done()
        assert first.result(timeout=5)["action"][0].item() == 2.0
        assert second.result(timeout=5)["action"][0].item() == 4.0


def test_a_client_blocked_on_a_full_channel_sees_peer_failure_within_2s_of_kill_9():
    owner = queue_server().start()
    try:
        client = owner.client()
        hung = client.submit(small(2e6))  # the server hangs in this forward pass and stops reading
        outcome: dict = {}

        sent = []

        def flood():
            try:
                for i in range(64):  # 64 MiB: far more than the channel holds
                    client.submit(big(i))
                    sent.append(i)
                outcome["error"] = None
            except BaseException as exc:  # noqa: BLE001 - checked below
                outcome["error"] = exc
            outcome["at"] = time.monotonic()

        flooder = threading.Thread(target=flood, daemon=True)
        flooder.start()
        wait_until(lambda: _stalled(sent), timeout=30, what="the flood to stall")
        assert flooder.is_alive(), "the channel should be full while the server does not read"
        os.kill(owner.host.pid, signal.SIGKILL)
        killed = time.monotonic()
        flooder.join(10)
        assert not flooder.is_alive()
        assert isinstance(outcome["error"], PeerFailureError)
        assert outcome["at"] - killed < 2.0
        with pytest.raises(PeerFailureError):
            hung.result(timeout=5)
    finally:
        owner.shutdown()


def _stalled(sent: list, quiet: float = 0.2) -> bool:
    """True once ``sent`` has not grown for ``quiet`` seconds (a blocked writer: 1 MiB takes about a millisecond)."""
    count = len(sent)
    time.sleep(quiet)
    return len(sent) == count


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_channels_and_their_socket_duplicates_are_closed_with_the_transport():
    import gc

    from transports.queue import QueueTransport

    before = None
    for i in range(4):  # the first round opens what stays open for the session (the forkserver, the tracker)
        if i == 1:
            before = _open_fds()
        with queue_server() as owner:
            clients = [owner.client() for _ in range(3)]
            for i, c in enumerate(clients):
                assert c.submit(small(i)).result(timeout=10)["action"][0].item() == 2.0 * i
            del clients
        transport = QueueTransport()  # an in-process pair: client and server sockets made here
        transport.mark_serving(os.getpid())
        client, server = transport.client(), transport.server()
        client.submit(small(1))
        batch = server.collect(4, 1, 0.0, 1.0)
        server.reply(batch, TensorDict({"action": torch.ones(1, 4)}, [1]))
        del client, server, batch
        transport.close()
        gc.collect()
    assert _open_fds() <= before


def _spin_in_child(spinners, flags, seconds) -> None:
    def poll():
        flags[0] = 1  # started: the child polls for endpoint 1
        return bool(flags[1])  # released

    spinners.spin(1, poll, seconds)


class _Release:
    """Ends the child's polling: a flag in shared memory, read without a lock (a child killed while it held a lock
    would leave it held, and the test would hang setting it)."""

    def __init__(self, flags):
        self.flags = flags

    def set(self) -> None:
        self.flags[1] = 1


@contextlib.contextmanager
def _polling_child(n: int, seconds: float):
    """A child process polling for endpoint 1 of ``Spinners(n)`` for up to ``seconds`` (until released): yields the
    spinners, the child and its :class:`_Release`; closes everything on exit."""
    from components.hosts.process import context as process_context
    from transports._shared import Spinners

    ctx = process_context()  # a process of its own: the spinners travel by name
    spinners = Spinners(n)
    flags = ctx.RawArray("b", 2)  # [started, released]
    release = _Release(flags)
    child = ctx.Process(target=_spin_in_child, args=(spinners, flags, seconds))
    try:
        child.start()
        wait_until(lambda: flags[0] == 1, timeout=30, what="the child polls for endpoint 1")
        yield spinners, child, release
    finally:
        release.set()
        child.join(30)
        if child.is_alive():
            child.kill()
        spinners.close()


@pytest.mark.slow  # a spawned interpreter imports torch: seconds
def test_a_client_polls_only_while_no_other_client_does():
    with _polling_child(4, 30.0) as (spinners, child, release):
        calls = []
        assert spinners.spin(0, lambda: calls.append(1) or True, 1.0) is False
        assert calls == []  # refused without polling: the other client polls
        release.set()
        child.join(30)
        assert child.exitcode == 0
        assert spinners.spin(0, lambda: calls.append(1) or True, 1.0) is True and calls == [1]
        with pytest.raises(ZeroDivisionError):
            spinners.spin(2, lambda: 1 / 0, 1.0)
        assert not spinners._until.any()  # a failing poll leaves no entry behind


@pytest.mark.slow  # a spawned interpreter imports torch: seconds
def test_the_entry_of_a_client_killed_while_polling_expires():
    with _polling_child(2, 1.0) as (spinners, child, _):
        os.kill(child.pid, signal.SIGKILL)
        child.join(30)
        assert spinners._until[1] > 0  # left behind by the killed client...
        wait_until(lambda: spinners.spin(0, lambda: True, 0.01), timeout=10, what="the entry to expire")
        assert spinners.spin(0, lambda: True, 0.01)  # ...but it expires, and the others poll again


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to start a process of another user")
def test_the_server_accepts_processes_of_its_own_user_only():
    import socket

    from transports.queue import QueueTransport

    transport = QueueTransport()
    transport.mark_serving(os.getpid())
    server = transport.server()
    try:
        pid = os.fork()
        if pid == 0:  # another user connects and writes a request: the server must close it unread
            code = 1
            try:
                os.setuid(65534)
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.connect("\0" + transport.address)
                sock.settimeout(10)
                try:
                    sock.sendall(b"\x00\x00\x00\x04junk")
                    code = 0 if sock.recv(1) == b"" else 2  # closed by the server
                except (ConnectionResetError, BrokenPipeError):  # closed by the server, the request unread
                    code = 0
            finally:
                os._exit(code)
        ended: list = []

        def stranger_done() -> bool:
            assert server.collect(4, 1, 0.0, 0.01) is None  # nothing of the stranger's is ever served
            done, status = os.waitpid(pid, os.WNOHANG)
            if done == pid:
                ended.append(os.waitstatus_to_exitcode(status))
            return bool(ended)

        wait_until(stranger_done, timeout=20, what="the stranger's connection closed")
        assert ended == [0] and server.conns == {}  # closed by the server, never admitted
        client = transport.client()  # this user's client is served as usual
        future = client.submit(small(3))
        batch = wait_until(lambda: server.collect(4, 1, 0.0, 0.01), timeout=10, what="the request")
        server.reply(batch, TensorDict({"action": torch.ones(1, 4)}, [1]))
        assert future.result(timeout=10)["action"].tolist() == [1.0] * 4
    finally:
        server.close()
        transport.close()


class _VirtualClock:
    """``time`` for transports._shared that a test drives: each reading advances it by ``tick`` seconds (a poll costs
    that), a sleep by its length; the policy under test then sees exactly the waits the test describes, whatever else
    runs on the machine."""

    def __init__(self, tick: float = 5e-6):
        self.now, self.tick = 0.0, tick

    def perf_counter(self) -> float:
        self.now += self.tick
        return self.now

    monotonic = perf_counter

    def sleep(self, seconds: float) -> None:
        self.now += max(0.0, seconds)


def test_an_adaptive_spin_polls_as_long_as_its_recent_waits_and_no_longer(monkeypatch):
    from transports import _shared
    from transports._shared import SPIN_MAX_S, SPIN_S, AdaptiveSpin

    clock = _VirtualClock()
    monkeypatch.setattr(_shared, "time", clock)
    monkeypatch.setattr(_shared.os, "sched_yield", lambda: None)
    spin, blocked = AdaptiveSpin(), []

    def waits(after: float, n: int) -> None:
        """``n`` waits whose answer comes ``after`` seconds in; a block waits the rest out and is recorded."""
        for _ in range(n):
            due = clock.now + after
            ready = lambda: clock.now >= due  # noqa: E731
            assert spin.wait(ready, lambda: blocked.append(1) or clock.sleep(due - clock.now) or True)

    waits(300e-6, 30)  # answers within the cap: the budget grows past them and the waits stop blocking
    assert 1.5 * 300e-6 <= spin.budget() <= SPIN_MAX_S
    blocked.clear()
    waits(300e-6, 10)
    assert blocked == []
    waits(20e-3, 30)  # answers far beyond the cap: it polls the floor only, then blocks
    assert spin.budget() == SPIN_S
    blocked.clear()
    waits(20e-3, 3)
    assert len(blocked) == 3