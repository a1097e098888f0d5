"""Ray across hosts: the head on host a (with the driver), collectors pinned to host b by a custom resource, every
payload over ``distributed`` (gloo across the hosts); host b lost mid-run, with and without a spare node."""

from __future__ import annotations

import csv
import json
import time

import pytest

from tests.helpers import wait_until
from tests.hosts.network import Listened
from tests.hosts.ray_nodes import HEALTH, WORKER_PORTS, RayNodes, launcher

pytestmark = [pytest.mark.hosts, pytest.mark.slow]

RAY_DAEMONS = ("gcs_server", "raylet", "python3", "ray::RuntimeEnv", "ray::DashboardA", "dashboard_agent")
"""Ray's own processes, which listen on every interface (guarded by the cluster's token): see the page."""
NODE_DEAD_S = HEALTH["health_check_period_ms"] * HEALTH["health_check_failure_threshold"] / 1000
BOUND_S = NODE_DEAD_S + 40
"""How long after host b is cut off the run must have reacted: Ray marks the node dead after its health check
(NODE_DEAD_S here), then the driver names the lost collector or Ray restarts it on a spare."""


@pytest.fixture
def ray_nodes(hosts):
    nodes = RayNodes(hosts.set_id)
    try:
        yield nodes
    finally:
        for host in hosts.all:
            host.end_all()
        nodes.remove()


def _training(run_dir) -> bool:
    try:
        return "train/" in (run_dir / "metrics.csv").read_text()
    except FileNotFoundError:
        return False


def test_ppo_solves_cartpole_with_collectors_pinned_to_another_host(hosts, ray_nodes, tmp_path):
    ray_nodes.head(hosts.a)
    ray_nodes.worker(hosts.b, {"collect": 2})
    run_dir = tmp_path / "run"
    run = launcher(hosts.a, ray_nodes, run_dir, "+recipe=ppo", "seed=0")
    listened = Listened([hosts.a, hosts.b], every=1.0)
    run.wait(240)
    listened.stop()
    _, err = run.communicate(timeout=60)
    assert run.returncode == 0, err[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["solved"] and summary["final_mean_return"] >= 475, summary
    services = json.loads((run_dir / "services.json").read_text())
    assert services["collector"]["nodes"] == [hosts.b.address] * 2, services
    for name in ("logger", "weight_sync", "replay", "inference"):  # pinned to the head's node
        assert services[name]["nodes"] == [hosts.a.address], services
    # our sockets (the relays, stores and gloo pairs, in the driver and in the actors) are on each host's own
    # address or its loopback; only Ray's own listen on every interface: its daemons, and the core worker of each
    # worker process (our actors' too) on a port of the range ray start was given
    wrong = listened.elsewhere(exempt=lambda s: bool(set(s[3]) & set(RAY_DAEMONS))
                               or WORKER_PORTS[0] <= s[2] <= WORKER_PORTS[1])
    assert not wrong, wrong
    assert any(s[0] == "b" and s[1] == hosts.b.address and "ray::HostActor" in str(s[3]) for s in listened.seen)


def test_a_node_started_without_the_key_is_a_configuration_error_naming_it(hosts, ray_nodes, tmp_path):
    ray_nodes.head(hosts.a, keyless=True)  # the driver has the key (planning insists), the node's actors do not
    run = launcher(hosts.a, ray_nodes, tmp_path / "run", "+recipe=ppo")
    _, err = run.communicate(timeout=180)
    assert run.returncode == 2, err[-3000:]
    assert "configuration error:" in err and "set RLSVC_KEY" in err and "full_key: transport_options.host" in err, \
        err[-3000:]


def test_a_lost_host_without_a_spare_ends_the_run_naming_it(hosts, ray_nodes, tmp_path):
    ray_nodes.head(hosts.a)
    ray_nodes.worker(hosts.b, {"collect": 2})
    run_dir = tmp_path / "run"
    run = launcher(hosts.a, ray_nodes, run_dir, "+recipe=ppo", "recipe.total_frames=100000000",
                   "recipe.target_return=null")
    wait_until(lambda: _training(run_dir), timeout=180, what="training")
    hosts.b.link(False)
    cut = time.monotonic()
    _, err = run.communicate(timeout=BOUND_S + 60)
    ended = time.monotonic() - cut
    assert run.returncode == 3, err[-3000:]
    assert f" on {hosts.b.address}) died" in err and "error: collector (ray" in err, err[-3000:]  # the host named
    assert ended < BOUND_S, ended
    print(f"the run ended {ended:.1f} s after host b was cut off (bound {BOUND_S:g} s)")


def test_a_lost_host_with_a_spare_is_replaced_and_the_run_finishes(hosts, ray_nodes, tmp_path):
    ray_nodes.head(hosts.a)
    ray_nodes.worker(hosts.b, {"collect": 2})
    run_dir = tmp_path / "run"
    run = launcher(hosts.a, ray_nodes, run_dir, "+recipe=impala", "recipe.num_envs=4", "recipe.unroll_length=16",
                   "recipe.batch_size=2", "recipe.total_frames=8192", "recipe.target_return=null",
                   "components.collector.resources.max_restarts=1")
    wait_until(lambda: _training(run_dir), timeout=180, what="training")
    ray_nodes.worker(hosts.c, {"collect": 2})  # the spare joins while the run goes on
    hosts.b.link(False)
    cut = time.monotonic()
    at_cut = _series(run_dir).get("train/updates", [0])[-1]
    wait_until(lambda: any("ray::HostActor" in str(s.programs) for s in hosts.c.listening()), timeout=BOUND_S,
               what="Ray restarts the collectors on the spare, host c")
    restarted = time.monotonic() - cut
    _, err = run.communicate(timeout=180)
    assert run.returncode == 0, err[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["frames"] == 8192, summary
    # every unroll handed over was learned from: two per update, none dropped, none lost with host b
    series = _series(run_dir)
    assert at_cut < series["train/updates"][-1] == 8192 // (16 * 2) and series["lag/dropped"][-1] == 0, series
    print(f"the collectors ran on host c {restarted:.1f} s after host b was cut off (bound {BOUND_S:g} s)")


def _series(run_dir) -> dict[str, list[float]]:
    series: dict[str, list[float]] = {}
    try:
        with open(run_dir / "metrics.csv") as f:
            for row in csv.DictReader(f):
                series.setdefault(row["tag"], []).append(float(row["value"]))
    except FileNotFoundError:
        pass
    return series
