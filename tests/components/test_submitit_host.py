"""The ``submitit`` host, on submitit's local executor (real subprocess jobs, no Slurm needed): the job connects back
and authenticates, strangers are dropped unheard, a dead job is a peer failure naming it, and stop leaves nothing.
The same host on a real Slurm: tests/launcher/test_slurm_collectors.py."""

import os
import signal
import socket
import threading
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client

import pytest

from components.hosts import host_class
from components.hosts.submitit import SubmititHost, SubmititSettings
from transports.kernel.errors import ConfigurationError, PeerFailureError, RemoteError

from tests.helpers import process_gone, wait_until

pytestmark = pytest.mark.slow  # each job is a fresh interpreter that imports torch


class Echo:
    """A target that answers where it runs."""

    def where(self, x):
        return x, os.getpid()


class Broken:
    def __init__(self):
        raise ValueError("no env here")


@pytest.fixture
def local_session(tmp_path):
    with SubmititHost.session({"cluster": "local", "connect_timeout": 120}, run_dir=str(tmp_path)):
        yield tmp_path


def _deaths():
    deaths, died = [], threading.Event()

    def on_death(reason):
        deaths.append(reason)
        died.set()

    return deaths, died, on_death


def test_a_job_serves_calls_and_its_death_names_it(local_session):
    deaths, died, on_death = _deaths()
    host = host_class("submitit")("collector-0", Echo, on_death=on_death)
    host.launch()
    # strangers reach the port before the job is even submitted (at wait_ready): one with the wrong key, one with
    # garbage; both are dropped unheard, then the job's own connection is taken
    refused = []

    def wrong_key():
        try:
            Client(host.address, family="AF_INET", authkey=b"not the key")
        except AuthenticationError as exc:
            refused.append(exc)

    stranger = threading.Thread(target=wrong_key)
    stranger.start()
    wait_until(lambda: _pending_connections(host.address) >= 1, timeout=10, what="the stranger connected")
    with socket.create_connection(host.address) as raw:
        raw.sendall(b"\x00\x00\x00\x10garbage garbage!")
        host.wait_ready()
    stranger.join(10)
    assert len(refused) == 1
    try:
        assert host.job_id and os.path.isdir(os.path.join(local_session, "submitit", host.job_id))
        value, pid = host.call("where", [1, 2], timeout=30)
        assert value == [1, 2] and pid != os.getpid() and host.pid is None
        os.kill(pid, signal.SIGKILL)
        assert died.wait(5), "a killed job is reported within 5 s"
        assert deaths[0].startswith(f"collector-0: the local submitit job {host.job_id} ended (")
        assert "its log: " in deaths[0]
        with pytest.raises(PeerFailureError, match=f"job {host.job_id} ended"):
            host.call("where", 1, timeout=10)
    finally:
        host.shutdown(10)
    wait_until(lambda: process_gone(pid), timeout=10, what="the job's process is gone")


def _pending_connections(address) -> int:
    """Connections to ``address`` established from this process (the listener has not accepted them yet)."""
    port = f"{address[1]:04X}"
    with open("/proc/net/tcp") as f:
        return sum(1 for line in f if line.split()[2].endswith(f":{port}") and line.split()[3] == "01")


def test_hosts_launched_together_go_out_as_one_batch_and_stop_cleanly(local_session):
    hosts = [host_class("submitit")(f"collector-{w}", Echo, index=(w, 2)) for w in range(2)]
    for host in hosts:
        host.launch()
    for host in hosts:
        host.wait_ready()
    pids = [host.call("where", w, timeout=30)[1] for w, host in enumerate(hosts)]
    assert len(set(pids)) == 2 and len({h.job_id for h in hosts}) == 2
    jobs = [h.job for h in hosts]
    for host in hosts:
        host.shutdown(20)
    for job, pid in zip(jobs, pids):
        assert job.done() and job.state in ("DONE", "FINISHED", "COMPLETED"), job.state  # returned, not cancelled
        wait_until(lambda: process_gone(pid), timeout=10, what="the job's process is gone")
    assert all(h._server is None for h in hosts)  # the listening sockets are closed


def test_an_error_while_building_surfaces_at_start(local_session):
    host = host_class("submitit")("collector-0", Broken)
    with pytest.raises(RemoteError, match="no env here"):
        host.start()
    host.shutdown(10)
    assert host.job.done()


def test_settings_are_checked_before_anything_is_submitted(monkeypatch):
    with pytest.raises(ConfigurationError, match="submitit.cluster must be 'slurm' or 'local'"):
        SubmititSettings(cluster="lsf")
    monkeypatch.setenv("PATH", "/nonexistent")
    assert SubmititSettings(cluster="slurm").cluster == "slurm"  # planning for a cluster needs none here (a dry run)
    with pytest.raises(ConfigurationError, match="no sbatch is on the PATH.*submitit.cluster=local"):
        SubmititHost.check_session({"cluster": "slurm"}, {})  # what the machine that runs the plan must offer
    SubmititHost.check_session({"cluster": "local"}, {})
