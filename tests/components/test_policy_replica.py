"""Policy replicas (``components.collector.local_policy``): the policy run in each collector worker, fed by weight
sync; real worker processes, a real shared-memory weight sync and the PPO recipe's policy."""

from __future__ import annotations

import pickle

import torch

from components.collectors import Collector, CollectorConfig
from components.inference import InferenceServer, InferenceServerConfig, PolicyReplica
from components.weight_sync import WeightSync, WeightSyncConfig

from tests.factories import cartpole_envs, ppo_cartpole_policy


def test_a_replica_travels_as_its_factory_and_builds_where_it_is_first_called():
    replica = PolicyReplica(ppo_cartpole_policy)
    replica(_request(3))
    copy = pickle.loads(pickle.dumps(replica))
    assert "built=False" in repr(copy) and "built=True" in repr(replica)
    assert len(pickle.dumps(replica)) < 2000  # its factory, not the module


def test_a_replica_answers_as_a_direct_server_does():
    with InferenceServer(InferenceServerConfig(placement="direct"), policy_factory=ppo_cartpole_policy) as srv:
        expected = srv.client()(_request(5))
    got = PolicyReplica(ppo_cartpole_policy)(_request(5))
    assert set(got.keys()) == set(expected.keys())
    for key in expected.keys():
        assert torch.equal(got[key], expected[key]), key


def test_workers_with_replicas_collect_what_a_server_serves():
    with InferenceServer(InferenceServerConfig(placement="direct"), policy_factory=ppo_cartpole_policy) as srv:
        with Collector(CollectorConfig(frames_per_batch=4 * 8, total_frames=4 * 8 * 3, placement="direct"),
                       create_env_fn=cartpole_envs(4), policy=srv, seed=7) as collector:
            served = list(collector)
    with Collector(CollectorConfig(frames_per_batch=4 * 8, total_frames=4 * 8 * 3, placement="process"),
                   create_env_fn=cartpole_envs(4), policy=PolicyReplica(ppo_cartpole_policy), seed=7) as collector:
        local = list(collector)
    for a, b in zip(served, local, strict=True):
        for key in ("observation", "action", "sample_log_prob", ("next", "reward"), ("next", "observation")):
            assert torch.equal(a[key], b[key]), key


def test_replicas_in_worker_processes_take_each_pushed_version():
    learner = ppo_cartpole_policy()
    with WeightSync(WeightSyncConfig(placement="process"), template=learner) as sync:
        replica = PolicyReplica(ppo_cartpole_policy, sync.client())
        with Collector(CollectorConfig(frames_per_batch=2 * 4 * 8, total_frames=-1, num_collectors=2,
                                       placement="process"), create_env_fn=cartpole_envs(4), policy=replica,
                       seed=1) as collector:
            batches = iter(collector)
            first = next(batches)
            with torch.no_grad():  # a policy that always pushes right
                for p in learner.parameters():
                    p.zero_()
                learner.actor.net[4].bias.copy_(torch.tensor([-50.0, 50.0]))
            version = sync.client().push(learner)
            second = next(batches)
            batches.close()
    assert (first["policy_version"] == 0).all() and first["action"].unique().numel() == 2
    assert (second["policy_version"] == version).all() and version >= 1
    assert (second["action"] == 1).all()


def _request(n: int):
    from tensordict import TensorDict

    from components.inference.sampling import SAMPLE_SEED

    return TensorDict({"observation": torch.randn(n, 4, generator=torch.Generator().manual_seed(n)),
                       SAMPLE_SEED: torch.arange(n, dtype=torch.int64)}, [n])
