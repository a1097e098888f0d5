"""The ``distributed`` host: a local worker rank with its torch.distributed environment, reported when it dies."""

import os
import signal
import threading

import pytest
import torch

from components.hosts import host_class
from transports.kernel.errors import PeerFailureError

from tests.helpers import process_gone, wait_until

pytestmark = pytest.mark.slow  # a child process each


class RankEnv:
    """A target that reports the rank variables it was built with."""

    def __init__(self):
        self.env = {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")}

    def read(self):
        return self.env, os.getpid()


def test_a_rank_gets_its_environment_and_its_death_is_reported():
    deaths = []
    died = threading.Event()

    def on_death(reason):
        deaths.append(reason)
        died.set()

    host = host_class("distributed")("collector-1", RankEnv, on_death=on_death, index=(1, 3))
    host.start()
    try:
        env, pid = host.call("read", timeout=30)
        assert env == {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "3", "LOCAL_WORLD_SIZE": "3"}
        assert pid == host.pid and pid != os.getpid() and "RANK" not in os.environ
        os.kill(pid, signal.SIGKILL)
        assert died.wait(5), "a killed rank is reported within 5 s"
        assert deaths == ["the collector-1-rank1 process died (killed by SIGKILL)"]
        with pytest.raises(PeerFailureError):
            host.call("read", timeout=10)
    finally:
        host.shutdown(5)
    wait_until(lambda: process_gone(pid), timeout=10, what="the rank is reaped")


def test_collector_ranks_on_this_machine_hand_rollouts_over_through_shared_memory():
    """A rank may run on another node, so it probes for the driver's segment; a local rank finds it and hands its
    rollouts over through a shared slot, gone with the rank."""
    from components.collectors import Collector, CollectorConfig
    from transports.segments import segments_of

    from tests.factories import LocalPolicy, cartpole_envs

    with Collector(CollectorConfig(frames_per_batch=2 * 4 * 2, total_frames=2 * 4 * 2 * 2, num_collectors=2,
                                   placement="distributed"), create_env_fn=cartpole_envs(2), policy=LocalPolicy(),
                   seed=4) as collector:
        batches = list(collector)
        pids = [host.pid for host in collector.hosts]
        assert sorted(collector._received.slots) == [0, 1]
        assert all(len(segments_of([pid])) == 1 for pid in pids)
    assert [b.batch_size for b in batches] == [torch.Size([4, 4])] * 2
    wait_until(lambda: segments_of(pids) == [], timeout=10, what="the ranks' slots are removed")
