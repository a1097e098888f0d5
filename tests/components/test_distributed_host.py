"""The ``distributed`` host: a local worker rank with its torch.distributed environment, reported when it dies."""

import os
import signal
import threading

import pytest

from components.hosts import host_class
from transports.errors import PeerFailureError

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
        assert deaths == [f"the collector-1-rank1 process died (killed by SIGKILL)"]
        with pytest.raises(PeerFailureError):
            host.call("read", timeout=10)
    finally:
        host.stop(5)
    wait_until(lambda: process_gone(pid), timeout=10, what="the rank is reaped")
