"""Beyond one node: a two-node Ray cluster on loopback (two raylets on this machine); collectors are placed on
the second node by a custom resource, and a run trains with them there."""

import json
import os
import shutil

import pytest

from components.collectors import Collector, CollectorConfig
from components.hosts import Resources
from transports.ray import import_ray
from launcher.cli import launch
from tests.factories import LocalPolicy, cartpole_envs
from tests.helpers import our_live_actors, wait_until

pytestmark = pytest.mark.slow  # a cluster of two raylets of its own: ~10 s to start on 2 cores


@pytest.fixture(scope="module")
def two_nodes(own_ray_cluster):
    ray = import_ray()
    from ray.cluster_utils import Cluster

    base = f"/tmp/r2n{os.getpid()}"  # short: Ray's Unix sockets live there
    os.makedirs(os.path.join(base, "ray"), exist_ok=True)
    saved = os.environ.get("RAY_TMPDIR")
    os.environ["RAY_TMPDIR"] = base  # the test cluster's address file goes there, not to the machine's /tmp/ray
    cluster = Cluster(initialize_head=True, head_node_args=dict(
        num_cpus=2, node_ip_address="127.0.0.1", temp_dir=base, include_dashboard=False))
    try:
        node_b = cluster.add_node(num_cpus=1, node_ip_address="127.0.0.1", resources={"node_b": 2})
        ray.init(address=cluster.address, namespace="tests_two_nodes", log_to_driver=False)
        try:
            yield cluster, node_b.node_id
            assert our_live_actors() == []
        finally:
            ray.shutdown()
    finally:
        cluster.shutdown()
        shutil.rmtree(base, ignore_errors=True)
        if saved is None:
            os.environ.pop("RAY_TMPDIR", None)
        else:
            os.environ["RAY_TMPDIR"] = saved


def test_both_raylets_are_alive_on_loopback(two_nodes):
    nodes = [n for n in import_ray().nodes() if n["Alive"]]
    assert len(nodes) == 2 and {n["NodeManagerAddress"] for n in nodes} == {"127.0.0.1"}


def test_collectors_land_on_the_node_with_the_custom_resource(two_nodes):
    _, node_b = two_nodes
    collector = Collector(CollectorConfig(frames_per_batch=16, total_frames=32, num_collectors=2, placement="ray"),
                          create_env_fn=cartpole_envs(2), policy=LocalPolicy())
    with collector.with_resources(Resources(custom={"node_b": 1})):
        assert [w.node_id() for w in collector.hosts] == [node_b, node_b]
        assert len(list(collector)) == 2


def test_a_run_trains_with_its_collectors_on_the_second_node(two_nodes, compose_cfg, tmp_path):
    # the launcher in this process: it joins the connection this process holds (to the two-node cluster)
    cluster, _ = two_nodes
    run_dir = tmp_path / "run"
    cfg = compose_cfg("+recipe=ppo", "service=ray", f"ray.address={cluster.address}",
                      "components.collector.num_collectors=2", "+components.collector.resources.custom.node_b=1",
                      "recipe.num_envs=4", "recipe.num_steps=16", "recipe.total_frames=512", "recipe.target_return=null",
                      "launcher.progress=false", "launcher.plot=false")
    launch(cfg, str(run_dir))
    wait_until(lambda: our_live_actors() == [], timeout=10, what="the run's actors to stop")
    plan = json.loads((run_dir / "plan.json").read_text())
    collector = next(c for c in plan["components"] if c["name"] == "collector")
    assert collector["placement"] == "ray" and collector["resources"]["custom"] == {"node_b": 1}
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["frames"] >= 512 and summary["fps"] > 0
