"""The ``monarch`` placement and transport: owners in Monarch actors, a killed proc is a peer failure within 5 s,
errors keep their kind, and nothing is left behind."""

import functools
import os
import signal
import time

import pytest
import torch
from tensordict import TensorDict

from components.inference import InferenceServer, InferenceServerConfig
from transports.kernel.errors import PeerFailureError, RemoteError

from tests.factories import echo_factory
from tests.helpers import process_gone, wait_until

pytestmark = pytest.mark.slow  # a Monarch proc each


def test_a_killed_proc_fails_the_waiting_client_within_5_s_and_every_later_call(tmp_path):
    marker = str(tmp_path / "hung")
    server = InferenceServer(InferenceServerConfig(placement="monarch"),
                             policy_factory=functools.partial(echo_factory, 0.0, marker), transport="monarch")
    with server:
        client = server.client()
        answer = client(TensorDict({"observation": torch.ones(4)}))
        assert answer["action"].tolist() == [2.0] * 4
        with pytest.raises(RemoteError, match="negative marker in the batch"):  # the policy's error, at the call
            client(TensorDict({"observation": torch.full((4,), -2000.0)}))
        assert client(TensorDict({"observation": torch.ones(4)}))["action"][0].item() == 2.0  # still serving
        pid = server.host.pid
        assert pid != os.getpid()
        future = client.submit(TensorDict({"observation": torch.full((4,), 2e6)}))
        wait_until(lambda: os.path.exists(marker), timeout=30, what="the server blocks on the request")
        os.kill(pid, signal.SIGKILL)
        started = time.monotonic()
        with pytest.raises(PeerFailureError, match="inference"):
            future.result(30)
        assert time.monotonic() - started < 5
        with pytest.raises(PeerFailureError):
            client(TensorDict({"observation": torch.ones(4)}), timeout=10)
        assert not server.is_alive
    wait_until(lambda: process_gone(pid), timeout=10, what="the killed proc is reaped")


def test_the_owners_proc_ends_with_it():
    server = InferenceServer(InferenceServerConfig(placement="monarch"), policy_factory=echo_factory,
                             transport="monarch")
    with server:
        pid = server.host.pid
        assert server.client()(TensorDict({"observation": torch.ones(2)}))["action"].tolist() == [2.0, 2.0]
    wait_until(lambda: process_gone(pid), timeout=10, what="the owner's Monarch proc ends")


class Unsendable:
    """A target with an answer that cannot be pickled."""

    def lock(self):
        import threading

        return threading.Lock()

    def add(self, a, b):
        return a + b


def test_an_answer_that_cannot_travel_is_the_callers_error_and_the_actor_keeps_serving():
    from components.hosts import host_class

    host = host_class("monarch")("unsendable", Unsendable).start()
    try:
        with pytest.raises(RemoteError, match="pickle"):
            host.call("lock", timeout=30)
        assert host.call("add", 1, 2, timeout=30) == 3
    finally:
        host.shutdown(10)


def test_collector_workers_hand_rollouts_over_through_shared_memory():
    """A worker's proc runs on this machine: it writes each rollout into a shared slot the driver attaches once, and
    the slot is gone with the worker."""
    from components.collectors import Collector, CollectorConfig
    from transports.segments import segments_of

    from tests.factories import LocalPolicy, cartpole_envs

    with Collector(CollectorConfig(frames_per_batch=2 * 4, total_frames=2 * 4 * 2, num_collectors=1,
                                   placement="monarch"), create_env_fn=cartpole_envs(2), policy=LocalPolicy(),
                   seed=2) as collector:
        batches = list(collector)
        pid = collector.hosts[0].pid
        assert list(collector._received.slots) == [0] and len(segments_of([pid])) == 1
    assert [b.batch_size for b in batches] == [torch.Size([4, 2])] * 2
    wait_until(lambda: segments_of([pid]) == [], timeout=10, what="the worker's slots are removed")


def test_in_a_session_procs_stop_together_and_the_session_waits_for_them():
    """Each owner's target is closed when it stops, in order; its proc's teardown goes on beside the next owner's,
    and leaving the session waits for all of them."""
    from components.hosts import monarch

    with monarch.MonarchHost.session({}):
        servers = [InferenceServer(InferenceServerConfig(placement="monarch"), policy_factory=echo_factory,
                                   transport="monarch").start() for _ in range(2)]
        pids = [server.host.pid for server in servers]
        for server in servers:
            server.shutdown()
            assert not server.is_alive
        stopping = list(monarch._stopping.value)
        assert [thread.name for thread in stopping] == [f"{server.host.name}-proc-stop" for server in servers]
    assert monarch._stopping.value is None and not any(thread.is_alive() for thread in stopping)
    wait_until(lambda: all(process_gone(pid) for pid in pids), timeout=10, what="both procs end")
