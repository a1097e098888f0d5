"""The ``rpc`` host: collector workers driven through torch.distributed.rpc (one static world per collector)."""

import os
import pickle
import signal
import threading
import time

import pytest

from components.hosts import host_class, shutdown_all
from components.hosts.base import Resources
from transports.kernel.errors import ConfigurationError, PeerFailureError

from tests.helpers import process_gone, wait_until

pytestmark = pytest.mark.slow  # a world of child processes each


class Journal:
    """Records the calls it gets, in the order it runs them; ``hold`` blocks until a marker file appears."""

    def __init__(self):
        self.calls = []

    def note(self, i):
        self.calls.append(i)
        return i

    def read(self):
        return self.calls, os.getpid()

    def hold(self, marker):
        open(marker, "w").close()
        time.sleep(60)


def test_calls_run_in_the_order_sent_and_a_killed_worker_is_a_peer_failure_naming_it(tmp_path):
    deaths = []
    died = threading.Event()

    def on_death(reason):
        deaths.append(reason)
        died.set()

    hosts = [host_class("rpc")(f"collector-{w}", Journal, index=(w, 2), on_death=on_death if w else None)
             for w in range(2)]
    for host in hosts:
        host.launch()
    for host in hosts:
        host.wait_ready()
    try:
        answers = [hosts[0].submit("note", i) for i in range(50)]  # rpc threads may pick them up in any order
        assert [a.result(30) for a in answers] == list(range(50))
        calls, pid0 = hosts[0].call("read", timeout=30)
        assert calls == list(range(50)) and pid0 == hosts[0].pid != os.getpid()
        marker = str(tmp_path / "held")
        pending = hosts[1].submit("hold", marker)
        wait_until(lambda: os.path.exists(marker), timeout=30, what="worker 1 runs the call")
        pid1 = hosts[1].pid
        os.kill(pid1, signal.SIGKILL)
        started = time.monotonic()
        with pytest.raises(PeerFailureError, match=r"collector-1-rpc2 rpc worker \(rank 2\) died \(killed by SIGKILL\)"):
            pending.result(30)
        assert time.monotonic() - started < 5
        assert died.wait(5) and len(deaths) == 1 and "collector-1-rpc2" in deaths[0]
        with pytest.raises(PeerFailureError):
            hosts[1].call("read", timeout=10)
        assert hosts[0].call("note", 7, timeout=30) == 7  # the other worker keeps serving
    finally:
        shutdown_all(hosts, timeout=20)
    wait_until(lambda: process_gone(pid0) and process_gone(pid1), timeout=10, what="the workers are reaped")
    from torch.distributed import rpc

    assert not rpc.api._is_current_rpc_agent_set()  # the driver left the world: the next one can form


def test_arguments_that_cannot_travel_fail_at_the_call_site_and_later_calls_still_run():
    host = host_class("rpc")("collector-0", Journal).start()
    try:
        with pytest.raises((TypeError, pickle.PicklingError)):
            host.submit("note", threading.Lock())
        assert host.call("note", 1, timeout=30) == 1  # its number was not used: the worker is not left waiting for it
        assert host.call("read", timeout=30)[0] == [1]
    finally:
        host.shutdown(10)


def test_restarts_are_refused_before_anything_starts():
    with pytest.raises(ConfigurationError, match="max_restarts must be 0 on the rpc placement") as info:
        host_class("rpc")("collector-0", Journal, resources=Resources(max_restarts=1))
    assert info.value.path == "resources.max_restarts"


def test_one_collector_uses_the_placement_at_a_time():
    first = host_class("rpc")("collector-0", Journal, index=(0, 1))
    first.launch()
    try:
        with pytest.raises(ConfigurationError, match="one collector's workers use the rpc placement at a time"):
            host_class("rpc")("other-0", Journal, index=(0, 1)).launch()
        first.wait_ready()
        assert first.call("note", 3, timeout=30) == 3
    finally:
        first.shutdown(10)
