"""The hosts of the multi-node tests: network namespaces joined by a bridge (``.ci/hosts.sh``), one set per xdist
worker so that two workers never share one, made once per session and removed at its end, also when a test fails.
Every process a test starts on a host is ended and reaped by the ``hosts`` fixture at the end of that test."""

from __future__ import annotations

import os

import pytest

from tests.hosts import network, slurm

pytestmark = pytest.mark.hosts


def _set_id() -> int:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return int(worker.removeprefix("gw")) if worker.startswith("gw") else 0


@pytest.fixture(scope="session")
def host_set():
    """The session's hosts (namespaces), or a skip saying why they cannot be made here."""
    set_id = _set_id()
    try:
        hosts = network.up(set_id)
    except network.Unavailable as exc:
        pytest.skip(f"no network namespaces here: {exc}")
    try:
        yield hosts
    finally:
        network.down(set_id)
        assert not network.namespaces_left(set_id), "namespaces left behind"


@pytest.fixture
def hosts(host_set):
    """The hosts, with every link up; whatever the test started on them is ended and reaped afterwards."""
    for host in host_set.all:
        host.link(True)
    try:
        yield host_set
    finally:
        for host in host_set.all:
            host.end_all()
            host.link(True)
        for host in host_set.all:
            network.wait_until(lambda: not host.pids(), timeout=30, what=f"no process left on host {host.name}")


@pytest.fixture
def slurm_nodes(hosts):
    """A two-node Slurm on the hosts (``.ci/hosts_slurm.sh``: node a on host a, node b on host b), or a skip saying
    why it cannot run here. Stopped at the end of the test, before the hosts check that nothing is left on them; a
    job the test left queued or running fails it."""
    try:
        cluster = slurm.start(hosts)
    except slurm.Unavailable as exc:
        pytest.skip(f"no Slurm here: {exc}")
    try:
        yield cluster
        left = cluster.active()
        assert not left, f"jobs left in squeue: {left}"
    finally:
        slurm.stop(hosts)
