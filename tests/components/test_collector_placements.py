"""Collectors in direct, thread and process placement over real gymnasium envs."""

import os
import signal
import time
from functools import partial

import pytest
import torch

from components.collectors import Collector, CollectorConfig
from components.errors import PeerFailureError, RemoteError
from components.inference import InferenceServer, InferenceServerConfig
from components.replay import ReplayBuffer, ReplayConfig

from tests.helpers import proc_state, wait_until
from tests.factories import CartPolePolicy, LocalPolicy, cartpole_envs, crashing_envs

PLACEMENTS = ["direct", "thread", "process"]


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_batches_are_time_by_env_and_workers_are_seeded_differently(placement):
    workers = 1 if placement == "direct" else 2
    with Collector(CollectorConfig(frames_per_batch=3 * 8 * workers, total_frames=3 * 8 * workers * 3,
                                   num_collectors=workers, placement=placement), create_env_fn=cartpole_envs(3),
                   policy=LocalPolicy(), seed=11) as collector:
        batches = list(collector)
        assert collector.env_spec.n_actions == 2
        pids = [h.pid for h in collector.hosts if not h.same_process]
    assert len(batches) == 3
    batch = batches[0]
    assert batch.batch_size == torch.Size([8, 3 * workers])
    first = batch["observation"][0]
    assert len({tuple(row.tolist()) for row in first}) == 3 * workers  # every env of every worker differs
    assert len(pids) == (workers if placement == "process" else 0)
    for pid in pids:  # worker processes are gone after shutdown
        assert not os.path.exists(f"/proc/{pid}") or proc_state(pid) == "Z"




def test_process_collector_with_an_inference_owner_gives_each_worker_its_own_slot():
    with InferenceServer(InferenceServerConfig(placement="process"), policy_factory=CartPolePolicy,
                         transport="process_slot", request_layout=_request(2), response_layout=_response(2)) as server:
        with Collector(CollectorConfig(frames_per_batch=2 * 4 * 3, total_frames=2 * 4 * 3 * 2, num_collectors=3,
                                       placement="process"), create_env_fn=cartpole_envs(2),
                       policy=server) as collector:
            batches = list(collector)
    assert [b.batch_size for b in batches] == [torch.Size([4, 6])] * 2
    assert (batches[0]["policy_version"] == 0).all()


def _request(n):
    from tensordict import TensorDict

    return TensorDict({"observation": torch.zeros(n, 4)}, [n])


def _response(n):
    from tensordict import TensorDict

    return TensorDict({"action": torch.zeros(n, dtype=torch.long), "logits": torch.zeros(n, 2),
                       "policy_version": torch.zeros(n, dtype=torch.long)}, [n])


@pytest.mark.parametrize("placement", ["thread", "process"])
def test_workers_write_straight_into_replay(placement):
    with ReplayBuffer(ReplayConfig(capacity=1000, batch_size=8,
                                   placement="process" if placement == "process" else "thread")) as rb:
        client = rb.client()
        with Collector(CollectorConfig(frames_per_batch=2 * 5 * 2, total_frames=2 * 5 * 2 * 3, num_collectors=2,
                                       placement=placement), create_env_fn=cartpole_envs(2), policy=LocalPolicy(),
                       replay_buffer=rb) as collector:  # the owner: each worker gets its own endpoint
            counts = list(collector)
        assert counts == [20, 20, 20]
        assert len(client) == 60
        assert client.sample()["next", "reward"].shape == (8,)


@pytest.mark.parametrize("transport", ["queue", "shared_memory"])
def test_one_replay_client_copied_into_two_worker_processes_serves_both(transport):
    # each copy connects a channel of its own in its process (queue) or shares the storage by name: no answer
    # reaches the wrong process, and every write lands
    with ReplayBuffer(ReplayConfig(capacity=1000, batch_size=8, placement="process"), transport=transport) as rb:
        client = rb.client()
        with Collector(CollectorConfig(frames_per_batch=2 * 5 * 2, total_frames=-1, num_collectors=2,
                                       placement="process"), create_env_fn=cartpole_envs(2), policy=LocalPolicy(),
                       replay_buffer=client) as collector:
            counts = [collector.rollout() for _ in range(3)]
        assert counts == [20, 20, 20] and len(client) == 60


@pytest.mark.parametrize("placement", ["thread", "process"])
def test_unsynchronised_collection_yields_each_workers_rollout(placement):
    with Collector(CollectorConfig(frames_per_batch=2 * 4 * 2, total_frames=2 * 4 * 2 * 2, num_collectors=2,
                                   placement=placement, sync=False), create_env_fn=cartpole_envs(2),
                   policy=LocalPolicy()) as collector:
        batches = list(collector)
    assert len(batches) == 4 and all(b.batch_size == torch.Size([4, 2]) for b in batches)


@pytest.mark.parametrize("sync", [True, False])
def test_sync_collects_after_the_last_push_and_async_runs_one_batch_ahead(sync):
    # The driver takes a batch, waits (as a learner would while training), then pushes new weights. In sync mode
    # the next batch is collected only when asked for, so all of it sees the pushed version; unsynchronised, the
    # worker collected it during the wait, with the weights of before. Each batch is 4 steps: 4 policy requests.
    with InferenceServer(InferenceServerConfig(placement="process"), policy_factory=CartPolePolicy,
                         transport="process_slot", request_layout=_request(2), response_layout=_response(2)) as server:
        with Collector(CollectorConfig(frames_per_batch=2 * 4, total_frames=2 * 4 * 3, num_collectors=1,
                                       placement="process", sync=sync), create_env_fn=cartpole_envs(2),
                       policy=server) as collector:
            versions = []
            for i, batch in enumerate(collector):
                versions.append(set(batch["policy_version"].unique().tolist()))
                served = server.stats()["requests"]
                if i < 2 and not sync:  # "training" until the worker has collected batch i + 1 meanwhile
                    wait_until(lambda: server.stats()["requests"] >= 4 * (i + 2), timeout=30, what="the next batch")
                elif sync:  # "training" 0.2 s, dozens of times what 4 steps of 2 envs take: nothing is collected
                    time.sleep(0.2)
                    assert server.stats()["requests"] == served
                server.update_weights(CartPolePolicy().state_dict())  # version i + 1
    assert versions[0] == {0}
    if sync:
        assert versions[1:] == [{1}, {2}]
    else:
        assert versions[1:] == [{0}, {1}]


@pytest.mark.parametrize("placement, prefetch", [("thread", 1), ("process", 1), ("thread", 2), ("process", 2)])
def test_a_worker_crash_surfaces_with_its_traceback(placement, prefetch):
    # collecting ahead, the rollout that raised ends the worker's collecting thread and the ask waiting for it raises
    with Collector(CollectorConfig(frames_per_batch=2 * 10, total_frames=-1, num_collectors=1, placement=placement,
                                   sync=prefetch == 1, prefetch=prefetch), create_env_fn=partial(crashing_envs, 2, 5),
                   policy=LocalPolicy()) as collector:
        start = time.monotonic()
        with pytest.raises(RemoteError) as info:
            next(iter(collector))
        assert time.monotonic() - start < 2.0
    assert info.value.remote_type == "RuntimeError"
    assert "the environment simulator crashed" in info.value.remote_message
    assert "def step" in info.value.remote_traceback or "step" in info.value.remote_traceback


def test_a_killed_worker_is_a_peer_failure_within_2s():
    collector = Collector(CollectorConfig(frames_per_batch=2 * 4 * 2, total_frames=-1, num_collectors=2,
                                          placement="process"), create_env_fn=cartpole_envs(2),
                          policy=LocalPolicy()).start()
    pids = [w.pid for w in collector.hosts]
    try:
        next(iter(collector))
        os.kill(pids[1], signal.SIGKILL)
        start = time.monotonic()
        with pytest.raises(PeerFailureError):
            collector.rollout()
        assert time.monotonic() - start < 2.0
    finally:
        collector.shutdown()
    assert all(proc_state(pid) in ("gone", "Z") for pid in pids)  # the surviving worker was stopped too


@pytest.mark.parametrize("sync, prefetch", [(True, 1), (False, 1), (False, 3)])
def test_a_killed_process_worker_restarts_and_no_acknowledged_write_is_lost(sync, prefetch):
    from components.hosts import Resources

    with ReplayBuffer(ReplayConfig(capacity=10_000, batch_size=8, placement="process")) as rb:
        collector = Collector(CollectorConfig(frames_per_batch=2 * 4 * 2, total_frames=-1, num_collectors=2,
                                              placement="process", sync=sync, prefetch=prefetch),
                              create_env_fn=cartpole_envs(2), policy=LocalPolicy(), replay_buffer=rb)
        collector.with_resources(Resources(max_restarts=1)).start()
        try:
            batches = iter(collector)
            acknowledged = next(batches)
            first = collector.hosts[1].pid
            os.kill(first, signal.SIGKILL)
            wait_until(lambda: proc_state(first) in ("gone", "Z"), what="the worker dead")
            taken = 1
            # the interrupted rollout is retried on a restarted worker; rollouts the other worker collected ahead
            # (prefetch) may be handed over first, so take batches until the restart shows (bounded)
            for _ in range(20):
                acknowledged += next(batches)
                taken += 1
                if taken >= 5 and collector.hosts[1].pid != first:
                    break
            second = collector.hosts[1].pid
            assert second != first and collector.is_alive
            os.kill(second, signal.SIGKILL)  # its one restart is spent: now the death surfaces
            # dead before the next batches are asked for: a worker collecting ahead (prefetch) answers at once, and
            # could answer every one of them while a loaded machine is still ending the other
            wait_until(lambda: proc_state(second) in ("gone", "Z"), what="the restarted worker dead")
            with pytest.raises(PeerFailureError, match="collector-1"):
                for _ in range(4):
                    next(batches)
        finally:
            collector.shutdown()
        assert acknowledged == taken * (16 if sync else 8)
        assert len(rb.client()) >= acknowledged  # an interrupted rollout may have been written twice, never lost


@pytest.mark.parametrize("backend", ["thread", "process"])
def test_async_batched_collector_batches_requests_across_envs(backend):
    from components.collectors import AsyncBatchedCollector
    from components.envs import make_vector_env

    with AsyncBatchedCollector(CollectorConfig(placement=backend, frames_per_batch=64, total_frames=192),
                               create_env_fn=partial(make_vector_env, "CartPole-v1", 1), num_groups=4,
                               policy_factory=CartPolePolicy, seed=3) as collector:
        batches = list(collector)
        stats = collector._own_server.stats()
        server_kind = collector._own_server.transport_kind
    assert [b.batch_size for b in batches] == [torch.Size([64])] * 3
    assert set(torch.cat([b["env_id"] for b in batches]).tolist()) == {0, 1, 2, 3}
    assert (torch.cat([b["policy_version"] for b in batches]) == 0).all()
    assert stats["mean_batch_size"] > 1.0  # one forward served several envs
    assert server_kind == ("process_slot" if backend == "process" else "thread")


@pytest.mark.parametrize("backend", ["thread", pytest.param("process", marks=pytest.mark.slow)])
def test_async_batched_collector_hands_each_envs_trajectory_over_whole_and_in_order(backend):
    """Chunks travel through shared slots (one slot per worker here, so workers wait for the consumer): every
    env's transitions arrive in order, each step's next observation is the following step's observation unless the
    episode ended, and nothing is left in shared memory afterwards."""
    from components.collectors import AsyncBatchedCollector
    from components.envs import make_vector_env
    from transports.segments import segments_of

    ours = set(segments_of([os.getpid()]))  # whatever this process held before
    with AsyncBatchedCollector(CollectorConfig(placement=backend, frames_per_batch=48, total_frames=48 * 8),
                               create_env_fn=partial(make_vector_env, "CartPole-v1", 2), num_groups=4,
                               policy_factory=CartPolePolicy, seed=3, num_workers=2, chunk_steps=5,
                               num_slots=1) as collector:
        batches = list(collector)
        pids = [h.pid for h in collector.all_hosts() if h.pid is not None]
        assert len(collector.all_hosts()) == 3  # two env workers and the server made for them
    data = torch.cat(batches)
    assert len(data) == 48 * 8 and set(data["env_id"].tolist()) == set(range(8))
    for env in range(8):
        rows = data[data["env_id"] == env]
        length = rows["next", "episode_length"]
        assert ((length[1:] == length[:-1] + 1) | rows["next", "done"][:-1]).all()  # no step lost or repeated
        cont = ~rows["next", "done"][:-1]
        assert torch.equal(rows["next", "observation"][:-1][cont], rows["observation"][1:][cont])
    assert segments_of(pids) == [] and set(segments_of([os.getpid()])) <= ours


@pytest.mark.slow
def test_process_workers_hand_rollouts_over_through_shared_memory():
    """A process worker writes each rollout into a shared slot and answers with its index: the driver attaches the
    worker's segment once and copies each rollout out (every batch its own storage), the batches equal what a
    direct collector gets from the same seed, and the segment is gone with the worker."""
    from tests.components.test_collector_inference import _seeded_ppo_policy
    from transports.segments import segments_of

    with InferenceServer(InferenceServerConfig(placement="process"), policy_factory=_seeded_ppo_policy,
                         transport="queue") as server:
        with Collector(CollectorConfig(frames_per_batch=64, total_frames=256, num_collectors=1, placement="process"),
                       create_env_fn=cartpole_envs(4), policy=server, seed=3) as collector:
            shared = list(collector)
            pid = collector.hosts[0].pid
            assert len(segments_of([pid])) == 1 and list(collector._received.slots) == [0]
        assert segments_of([pid]) == []
        with Collector(CollectorConfig(frames_per_batch=64, total_frames=256, num_collectors=1, placement="direct"),
                       create_env_fn=cartpole_envs(4), policy=server, seed=3) as collector:
            direct = list(collector)
    assert len({b["observation"].data_ptr() for b in shared}) == len(shared) == 4
    for a, b in zip(shared, direct):
        for key in b.keys(include_nested=True, leaves_only=True):
            assert torch.equal(a.get(key), b.get(key)), key


@pytest.mark.parametrize("placement", ["direct", "process"])
def test_a_worker_collects_up_to_prefetch_rollouts_ahead_and_hands_over_the_same_rollouts(placement):
    """With ``prefetch=3`` the worker collects on a thread of its own: while the driver holds the first rollout it
    collects three more (16 policy requests each) where it runs apart from the driver (the driver asks for the next
    one as it takes one), two on the direct placement (where it asks when it needs it), and stops there; the
    rollouts it hands over, each from a slot of its own in one shared segment (process), are those of a worker that
    collects only when asked."""
    from tests.components.test_collector_inference import _seeded_ppo_policy
    from transports.segments import segments_of

    def batches(prefetch: int, watch: bool = False) -> list:
        with InferenceServer(InferenceServerConfig(placement="process"), policy_factory=_seeded_ppo_policy,
                             transport="queue") as server:
            with Collector(CollectorConfig(frames_per_batch=64, total_frames=5 * 64, num_collectors=1,
                                           placement=placement, sync=False, prefetch=prefetch),
                           create_env_fn=cartpole_envs(4), policy=server, seed=3) as collector:
                out = []
                for i, batch in enumerate(collector):
                    out.append(batch)
                    if watch and i == 0:  # the learner "trains": the worker runs ahead, as far as prefetch lets it
                        made = 16 * (4 if placement == "process" else 3)
                        wait_until(lambda: server.stats()["requests"] >= made, timeout=30, what="rollouts ahead")
                        assert server.stats()["requests"] == made
                        if placement == "process":
                            assert len(segments_of([collector.hosts[0].pid])) == 1
                return out

    ahead, asked = batches(3, watch=True), batches(1)
    assert len(ahead) == len(asked) == 5
    assert len({b["observation"].data_ptr() for b in ahead}) == 5  # each batch copied out of its slot
    for a, b in zip(ahead, asked):
        for key in b.keys(include_nested=True, leaves_only=True):
            if key != "policy_version":
                assert torch.equal(a.get(key), b.get(key)), key


def test_the_same_machine_probe_is_true_only_where_the_drivers_segment_is():
    """A worker that may or may not share this machine (a Ray actor) hands rollouts over through shared memory only
    when it finds the driver's probe segment with its token."""
    import pickle

    from components.collectors.handoff import Probe, SameMachine
    from transports.segments import segments_of

    probe = SameMachine()
    try:
        travelled = pickle.loads(pickle.dumps(probe))
        assert isinstance(travelled, Probe) and travelled.here()
        assert not Probe(travelled.name, bytes(16)).here()  # another segment by that name: another machine's
        assert not Probe(travelled.name + "_elsewhere", travelled.token).here()  # no such segment here
    finally:
        probe.close()
    assert travelled.name not in segments_of([os.getpid()])
    assert not travelled.here()  # closed with the collector
