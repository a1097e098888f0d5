"""A local Ray cluster and SIGTERM: its daemons and workers block the signal (a SIGTERM to the whole process group or
job step must not end them under the driver's orderly shutdown), and a SIGTERM that arrives while the cluster starts
reaches the driver's own handler once it has started, and the cluster is stopped with nothing of it left. The whole
run under a SIGTERM to its process group is tests/launcher/test_faults.py's."""

import os
import signal
import threading

import pytest

from components.hosts.ray import RayClusterConfig, ray_cluster
from tests.helpers import process_gone, wait_until
from transports.ray import import_ray

pytestmark = pytest.mark.slow  # a cluster of its own: seconds to start on 2 cores


class _Stop(BaseException):
    """What this test's SIGTERM handler raises (as the launcher's raises ``Terminated``)."""


def _pid() -> int:
    return os.getpid()


def _blocks_sigterm(pid: int) -> bool:
    with open(f"/proc/{pid}/status") as f:
        blocked = next(int(line.split()[1], 16) for line in f if line.startswith("SigBlk:"))
    return bool(blocked & (1 << (signal.SIGTERM - 1)))


def test_the_cluster_blocks_sigterm_and_a_sigterm_while_it_starts_stops_it_once_the_driver_s_handler_is_back(
        own_ray_cluster, monkeypatch):
    ray = import_ray()
    from ray._private import worker

    daemons: dict[str, int] = {}
    workers: list[int] = []
    blocking: dict[int, bool] = {}  # pid -> whether it blocks SIGTERM, read while the cluster runs
    real_init = ray.init

    def init_then_sigterm(*args, **kwargs):
        context = real_init(*args, **kwargs)
        daemons.update({kind: info.process.pid for kind, infos in worker._global_node.all_processes.items()
                        for info in infos})
        workers.append(ray.get(ray.remote(num_cpus=0)(_pid).remote(), timeout=60))  # started by the raylet
        blocking.update({pid: _blocks_sigterm(pid) for pid in [*daemons.values(), *workers]})
        # to the main thread, which is starting the cluster: pending until the driver's own handler is back
        signal.pthread_kill(threading.main_thread().ident, signal.SIGTERM)
        return context

    def stop(signum, frame):
        raise _Stop()

    monkeypatch.setattr(ray, "init", init_then_sigterm)
    saved = signal.signal(signal.SIGTERM, stop)
    try:
        with pytest.raises(_Stop):
            with ray_cluster(RayClusterConfig(num_cpus=1, namespace="tests_signals")):
                pytest.fail("the SIGTERM was not raised as the cluster's start ended")
    finally:
        signal.signal(signal.SIGTERM, saved)
    assert {"gcs_server", "raylet"} <= set(daemons), daemons
    assert {kind: blocking[pid] for kind, pid in daemons.items()} == {kind: True for kind in daemons}
    assert [blocking[pid] for pid in workers] == [True]
    assert not _blocks_sigterm(os.getpid())  # the driver's own mask is as it was
    assert not ray.is_initialized()
    wait_until(lambda: all(process_gone(pid) for pid in [*daemons.values(), *workers]), timeout=10,
               what="every process of the cluster ended")
