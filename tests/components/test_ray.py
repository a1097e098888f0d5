"""Ray placement against a real local Ray cluster on 127.0.0.1 (shared by the session, see conftest.ray_cluster)."""

import csv
import json
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import pytest
import torch
from tensordict import TensorDict

from components.collectors import Collector, CollectorConfig
from components.errors import PeerFailureError, RemoteError, ServiceTimeoutError
from components.inference import InferenceServer, InferenceServerConfig
from components.logger import CSVLogger, Logger, LoggerConfig
from components.hosts import Resources
from components.registry import RayServiceRegistry
from components.replay import ReplayBuffer, ReplayConfig
from components.weight_sync import WeightSync, WeightSyncConfig
from transports.segments import segments_of

from tests.helpers import our_live_actors, run_cli, wait_until
from tests.factories import CartPolePolicy, LocalPolicy, cartpole_envs, crashing_envs, echo_factory

pytestmark = [pytest.mark.usefixtures("ray_cluster"), pytest.mark.slow]  # every actor is a new worker process: seconds


def ray():
    import ray as _ray

    return _ray


def obs(value: float) -> TensorDict:
    return TensorDict({"observation": torch.full((4,), float(value))})


def actor_pid(actor) -> int:
    return ray().get(actor.handle.ready.remote())


def test_every_node_is_on_loopback():
    nodes = ray().nodes()
    assert nodes and all(n["NodeManagerAddress"] == "127.0.0.1" for n in nodes if n["Alive"])


# ---------------------------------------------------------------------------------------------- inference
@pytest.fixture(scope="module")
def server(ray_session):
    owner = InferenceServer(InferenceServerConfig(placement="ray", max_batch_size=16, timeout=0.01),
                            policy_factory=partial(echo_factory, 0.005)).start()
    yield owner
    owner.shutdown()
    wait_until(lambda: our_live_actors() == [], timeout=10, what="the server's actor to stop")


def test_inference_batches_concurrent_callers_and_answers_each(server):
    assert server.transport_kind == "ray"
    client = server.client()
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda i: client(obs(i))["action"][0].item(), range(64)))
    assert answers == [2.0 * i for i in range(64)]
    assert server.stats()["mean_batch_size"] > 1.0


def test_inference_remote_error_keeps_serving(server):
    client = server.client()
    with pytest.raises(RemoteError) as info:
        client(obs(-5000))
    assert info.value.remote_type == "ValueError" and "forward" in info.value.remote_traceback
    assert client(obs(3))["action"][0].item() == 6.0


def test_weight_update_is_seen_by_the_next_request(server):
    before = server.policy_version
    version = server.update_weights({"scale": torch.tensor(3.0)})
    assert version == before + 1
    answer = server.client()(obs(2))
    assert answer["action"][0].item() == 6.0 and answer["policy_version"].item() == version
    server.update_weights({"scale": torch.tensor(2.0)})


def _call_policy(client, value):
    return client(obs(value))["action"][0].item()


def test_clients_travel_to_ray_workers(server):
    task = ray().remote(_call_policy).options(num_cpus=0)
    assert ray().get(task.remote(server.client(), 21)) == 42.0


def test_a_killed_actor_is_a_peer_failure_within_5s():
    owner = InferenceServer(InferenceServerConfig(placement="ray"), policy_factory=partial(echo_factory, 0.0)).start()
    client = owner.client()
    try:
        assert client(obs(1))["action"][0].item() == 2.0
        os.kill(owner.host.pid, signal.SIGKILL)
        start = time.monotonic()
        with pytest.raises(PeerFailureError):
            client(obs(1), timeout=30)
        assert time.monotonic() - start < 5.0
        assert not owner.is_alive
    finally:
        owner.shutdown()


def test_a_failing_constructor_surfaces_at_start_with_its_traceback():
    before = our_live_actors()
    owner = InferenceServer(InferenceServerConfig(placement="ray"), policy_factory=partial(_broken_policy))
    with pytest.raises(RemoteError) as info:
        owner.start()
    assert "no such checkpoint" in info.value.remote_traceback
    assert our_live_actors() == before


def _broken_policy():
    raise FileNotFoundError("no such checkpoint")


def test_unavailable_resources_fail_start_with_a_clear_timeout():
    before = our_live_actors()
    owner = ReplayBuffer(ReplayConfig(capacity=8, placement="ray")).with_resources(
        {"custom": {"node_that_does_not_exist": 1}, "startup_timeout": 0.5})  # never schedules: any timeout fires
    with pytest.raises(ServiceTimeoutError, match="node_that_does_not_exist"):
        owner.start()
    assert our_live_actors() == before


# ---------------------------------------------------------------------------------------------- replay, logger
def test_replay_in_an_actor_loses_no_write_of_8_concurrent_producers():
    with ReplayBuffer(ReplayConfig(capacity=10_000, batch_size=16, placement="ray")) as rb:
        clients = [rb.client() for _ in range(8)]

        def produce(p):
            for i in range(10):
                clients[p].extend(TensorDict({"producer": torch.full((5,), p), "i": torch.full((5,), i)}, [5]))

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(produce, range(8)))
        client = rb.client()
        assert len(client) == 400
        state = client.state_dict()
        assert state is not None
        sample = client.sample()
        assert sample["producer"].shape == (16,) and set(sample["producer"].tolist()) <= set(range(8))


def test_logger_in_an_actor_writes_files_that_read_back(tmp_path):
    with Logger(LoggerConfig(placement="ray"), backend=CSVLogger(str(tmp_path))) as logger:
        client = logger.client()
        for step in range(5):
            client.log_scalar("loss", 1.0 / (step + 1), step=step)
        with pytest.raises(TypeError, match="uint8"):
            client.log_video("clip", torch.zeros(3, 3))  # refused at the call site; the logger keeps serving
        client.log_scalar("loss", 0.0, step=5)
    with open(tmp_path / "metrics.csv") as f:
        rows = [r for r in csv.DictReader(f) if r["tag"] == "loss"]
    assert [float(r["value"]) for r in rows] == [1.0 / (s + 1) for s in range(5)] + [0.0]
    assert [int(r["step"]) for r in rows] == list(range(6))


# ---------------------------------------------------------------------------------------------- weight sync
def _receive(sync_client, since):
    module = CartPolePolicy()
    return sync_client.poll(since, into=module), float(next(module.parameters()).flatten()[0])


def test_weight_sync_versions_reach_a_receiver_in_another_actor():
    with WeightSync(WeightSyncConfig(placement="ray")) as sync:
        client = sync.client()
        learner = CartPolePolicy()
        with torch.no_grad():
            for p in learner.parameters():
                p.fill_(0.25)
        assert client.push(learner) == 1
        assert client.push(learner) == 2
        task = ray().remote(_receive).options(num_cpus=0)
        version, value = ray().get(task.remote(client, 0))
        assert (version, value) == (2, 0.25)
        assert ray().get(task.remote(client, 2))[0] is None  # nothing newer
        assert sync.version == 2


# ---------------------------------------------------------------------------------------------- collectors
def test_ray_collectors_on_the_drivers_node_hand_rollouts_over_through_shared_memory():
    """Actors of the local node find the driver's probe segment: each writes its rollouts into a shared slot the
    driver attaches once; every segment (the workers' and the probe) is gone with the collector."""
    from transports.segments import segments_of

    before = set(segments_of([os.getpid()]))
    with Collector(CollectorConfig(frames_per_batch=2 * 5 * 2, total_frames=2 * 5 * 2 * 2, num_collectors=2,
                                   placement="ray"), create_env_fn=cartpole_envs(2), policy=LocalPolicy(),
                   seed=5) as collector:
        batches = list(collector)
        pids = [host.pid for host in collector.hosts]
        assert sorted(collector._received.slots) == [0, 1]
        assert all(len(segments_of([pid])) == 1 for pid in pids)
    assert [b.batch_size for b in batches] == [torch.Size([5, 4])] * 2
    assert batches[0]["observation"].data_ptr() != batches[1]["observation"].data_ptr()  # each batch its own copy
    first = batches[0]["observation"][0]
    assert len({tuple(row.tolist()) for row in first}) == 4  # every env of every worker seeded differently
    wait_until(lambda: segments_of(pids) == [], timeout=10, what="the workers' segments are removed")
    assert set(segments_of([os.getpid()])) == before


def test_ray_collectors_write_straight_into_a_ray_replay_buffer_and_use_a_ray_policy():
    with InferenceServer(InferenceServerConfig(placement="ray"), policy_factory=CartPolePolicy) as server, \
            ReplayBuffer(ReplayConfig(capacity=1000, batch_size=8, placement="ray")) as rb:
        with Collector(CollectorConfig(frames_per_batch=20, total_frames=60, num_collectors=2, placement="ray"),
                       create_env_fn=cartpole_envs(2), policy=server, replay_buffer=rb) as collector:
            counts = list(collector)
        assert counts == [20, 20, 20]
        client = rb.client()
        assert len(client) == 60
        assert (client.sample()["policy_version"] == 0).all()


def test_a_worker_crash_surfaces_with_its_traceback():
    with Collector(CollectorConfig(frames_per_batch=20, total_frames=-1, num_collectors=1, placement="ray"),
                   create_env_fn=partial(crashing_envs, 2, 5), policy=LocalPolicy()) as collector:
        with pytest.raises(RemoteError) as info:
            collector.rollout()
    assert "the environment simulator crashed" in info.value.remote_message


def test_a_restartable_worker_resumes_after_kill_9_and_no_acknowledged_write_is_lost():
    with ReplayBuffer(ReplayConfig(capacity=10_000, batch_size=8, placement="ray")) as rb:
        collector = Collector(CollectorConfig(frames_per_batch=2 * 4 * 2, total_frames=-1, num_collectors=2,
                                              placement="ray"), create_env_fn=cartpole_envs(2), policy=LocalPolicy(),
                              replay_buffer=rb)
        collector.with_resources(Resources(max_restarts=2)).start()
        try:
            acknowledged = collector.rollout()
            os.kill(collector.hosts[1].pid, signal.SIGKILL)
            acknowledged += collector.rollout()  # retried on the restarted worker
            acknowledged += collector.rollout()
        finally:
            collector.shutdown()
        assert acknowledged == 48
        assert len(rb.client()) >= acknowledged  # an interrupted rollout may have been written twice, never lost


def test_a_replaced_worker_s_slots_are_unlinked_though_its_tracker_died_with_it():
    collector = Collector(CollectorConfig(frames_per_batch=8, total_frames=-1, num_collectors=1, placement="ray"),
                          create_env_fn=cartpole_envs(2),
                          policy=LocalPolicy()).with_resources(Resources(max_restarts=1)).start()
    try:
        collector.rollout()
        killed = collector.hosts[0].pid
        assert segments_of([killed]), "the worker hands its rollouts over through slots of its own"
        os.killpg(os.getpgid(killed), signal.SIGKILL)  # its resource tracker too, as Ray ends a dead worker's group
        assert collector.rollout().batch_size == (4, 2)  # retried on the restarted worker
        assert segments_of([killed]) == [], "the killed worker's slots are unlinked as it is replaced"
    finally:
        collector.shutdown()


def test_a_worker_without_restarts_is_a_peer_failure():
    collector = Collector(CollectorConfig(frames_per_batch=8, total_frames=-1, num_collectors=1, placement="ray"),
                          create_env_fn=cartpole_envs(2), policy=LocalPolicy()).start()
    try:
        collector.rollout()
        pid = collector.hosts[0].pid
        assert segments_of([pid]), "the worker hands its rollouts over through slots of its own"
        pgid = os.getpgid(pid)
        assert pgid != os.getpgid(0), "Ray gives each worker a process group of its own"
        # the worker and its resource tracker at once, as Ray itself ends a dead worker's process group: no tracker
        # is left to unlink the worker's slots
        os.killpg(pgid, signal.SIGKILL)
        start = time.monotonic()
        with pytest.raises(PeerFailureError):
            collector.rollout()
        assert time.monotonic() - start < 5.0
    finally:
        collector.shutdown()
    assert segments_of([pid]) == [], "the killed worker's slots are unlinked by the driver it handed rollouts to"


# ---------------------------------------------------------------------------------------------- registry
def _find_and_sample(namespace, name):
    registry = RayServiceRegistry(namespace)
    return len(registry.get_client(name))


def test_ray_registry_lets_independent_workers_find_services_by_name():
    registry = RayServiceRegistry()
    external = ReplayBuffer(ReplayConfig(capacity=100, placement="ray")).start()
    try:
        owned_client = registry.register("replay", ReplayBuffer, ReplayConfig(capacity=100, placement="ray"))
        registry.register("external", external)
        owned_client.extend(TensorDict({"x": torch.zeros(3)}, [3]))
        task = ray().remote(_find_and_sample).options(num_cpus=0)
        assert ray().get(task.remote(registry.namespace, "replay")) == 3
        assert ray().get(task.remote(registry.namespace, "external")) == 0
        assert registry.list() == ["external", "replay"] and "replay" in registry
        with pytest.raises(ValueError, match="already registered"):
            registry.register("replay", ReplayBuffer, ReplayConfig(capacity=10, placement="ray"))
        with pytest.raises(ValueError, match="only owners placed on 'ray'"):
            registry.register("local", ReplayBuffer, ReplayConfig(capacity=10, placement="thread"))
        with pytest.raises(KeyError, match="nothing"):
            registry.get_client("nothing")
        owned = registry.get("replay")
        registry.reset()
        assert not owned.is_alive  # the registry created it: stopped
        assert external.is_alive  # registered as a running owner: never stopped by reset
        assert registry.list() == []
    finally:
        registry.reset()
        external.shutdown()


# ---------------------------------------------------------------------------------------------- launcher
@pytest.mark.slow  # a second driver process (python -m launcher) joins this cluster by its address
def test_launcher_joins_a_running_cluster_with_a_mixed_plan_and_leaves_it_running(tmp_path):
    address = ray().get_runtime_context().gcs_address
    before = our_live_actors()
    run_dir = tmp_path / "run"
    proc = run_cli("+recipe=ppo", "service=ray", "components.logger.placement=process", f"ray.address={address}",
                   "ray.namespace=tests_cli", "recipe.num_envs=4", "recipe.num_steps=16", "recipe.total_frames=256",
                   "recipe.target_return=null", "launcher.progress=false", f"hydra.run.dir={run_dir}",
                   cwd=str(tmp_path), timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    plan = json.loads((run_dir / "plan.json").read_text())
    placements = {c["name"]: c["placement"] for c in plan["components"]}
    assert placements == {"logger": "process", "weight_sync": "ray", "replay": "ray", "inference": "ray",
                          "collector": "ray"}
    assert json.loads((run_dir / "summary.json").read_text())["frames"] >= 256
    assert "train/mean_return" in (run_dir / "metrics.csv").read_text()  # written by the process logger
    assert "joined" in (run_dir / "launcher.log").read_text()
    # the cluster it joined is still up, and the run left none of its actors behind
    assert ray().get(ray().remote(_call_policy_free).options(num_cpus=0).remote()) == 1
    assert our_live_actors() == before


def _call_policy_free():
    return 1
