"""What makes seeded runs learn the same in every placement: per-row sampling seeds that travel with the requests,
and sync collection served with the weights pushed before it."""

import pytest
import torch
from tensordict import TensorDict

from components.collectors import Collector, CollectorConfig
from components.inference import InferenceServer, InferenceServerConfig
from components.inference.sampling import SAMPLE_SEED, env_streams, step_seeds, uniform
from components.weight_sync import WeightSync, WeightSyncConfig

from tests.factories import CartPolePolicy, cartpole_envs


class SeedEcho(torch.nn.Module):
    """Answers each row with the seed it came with (-1: none), and an action drawn from it."""

    def forward(self, td):
        seed = td.get(SAMPLE_SEED, None)
        td["seen"] = torch.full(td["observation"].shape[:-1], -1) if seed is None else seed.clone()
        td["action"] = torch.zeros(td["seen"].shape, dtype=torch.long) if seed is None else (uniform(seed, 1)[..., 0] < 0.5).long()
        return td


def test_streams_differ_per_env_and_step_and_repeat():
    streams = env_streams(range(10, 14))
    first, second = step_seeds(streams, 0)[0], step_seeds(streams, 1)[0]
    assert len(set(first.tolist()) | set(second.tolist())) == 8
    assert torch.equal(step_seeds(env_streams(range(10, 14)), 1)[0], second)
    assert torch.equal(step_seeds(env_streams([12]), 1)[0], second[2:3])  # an env's stream is its own
    assert torch.equal(step_seeds(streams, 0, 2), torch.stack([first, second]))  # a rollout's at once
    assert step_seeds(streams, 2**40).shape == (1, 4)


def test_uniforms_depend_on_the_row_only():
    seeds = step_seeds(env_streams(range(1000)), 3)[0]
    u = uniform(seeds, 2)
    assert u.shape == (1000, 2) and 0 < u.min() and u.max() < 1 and abs(u.mean().item() - 0.5) < 0.03
    assert torch.equal(uniform(seeds[7:9], 2), u[7:9])


@pytest.mark.parametrize("n", [1, 3])
def test_cpu_uniforms_are_the_bits_of_the_torch_formula(n):
    """CPU seeds are mixed in numpy, other devices in torch: both must draw the same numbers (a CUDA server and a CPU
    server sample the same actions)."""
    from components.inference.sampling import _uniform_torch

    seeds = torch.cat([step_seeds(env_streams(range(500)), 7)[0], torch.tensor([0, -1, 2**63 - 1, -(2**63)])])
    assert torch.equal(uniform(seeds, n), _uniform_torch(seeds, n))


SLOW = pytest.mark.slow  # a child process: seconds


@pytest.mark.parametrize("placement, transport", [("direct", None), ("thread", "thread")] + [
    pytest.param("process", t, marks=SLOW) for t in ("queue", "shared_memory", "process_slot")])
def test_collectors_send_a_seed_per_env_and_step_and_keep_it_out_of_rollouts(placement, transport):
    request = TensorDict({"observation": torch.zeros(2, 4)}, [2])
    response = TensorDict({"action": torch.zeros(2, dtype=torch.long), "seen": torch.zeros(2, dtype=torch.long),
                           "policy_version": torch.zeros(2, dtype=torch.long)}, [2])
    layouts = {"request_layout": request, "response_layout": response} if transport in ("shared_memory", "process_slot") else {}
    with InferenceServer(InferenceServerConfig(placement=placement), policy_factory=SeedEcho, transport=transport,
                         **layouts) as server, \
            Collector(CollectorConfig(frames_per_batch=2 * 3, total_frames=2 * 3 * 2, num_collectors=1),
                      create_env_fn=cartpole_envs(2), policy=server, seed=5) as collector:
        batches = list(collector)
    seen = torch.cat([b["seen"] for b in batches])
    expected = step_seeds(env_streams([5, 6]), 0, 6)
    assert torch.equal(seen, expected)
    assert SAMPLE_SEED not in batches[0].keys()


@SLOW
def test_a_fixed_layout_client_fills_seeds_a_caller_left_out():
    request = TensorDict({"observation": torch.zeros(4)})
    response = TensorDict({"action": torch.zeros((), dtype=torch.long), "seen": torch.zeros((), dtype=torch.long),
                           "policy_version": torch.zeros((), dtype=torch.long)})
    with InferenceServer(InferenceServerConfig(placement="process"), policy_factory=SeedEcho, transport="process_slot",
                         request_layout=request, response_layout=response) as server:
        torch.manual_seed(0)
        first = server.client()(request.clone())["seen"].item()
        torch.manual_seed(0)
        assert server.client()(request.clone())["seen"].item() == first  # from the caller's generator
        assert server.client()(request.clone().set(SAMPLE_SEED, torch.tensor(42)))["seen"].item() == 42


@pytest.mark.parametrize("placement", ["thread", pytest.param("process", marks=SLOW)])
def test_sync_collection_after_a_push_is_served_with_the_pushed_weights(placement):
    learner = CartPolePolicy()
    with WeightSync(WeightSyncConfig(placement=placement), template=CartPolePolicy()) as sync, \
            InferenceServer(InferenceServerConfig(placement=placement), policy_factory=CartPolePolicy,
                            weight_sync=sync.client()) as server, \
            Collector(CollectorConfig(frames_per_batch=2 * 8, total_frames=-1, num_collectors=1, sync=True),
                      create_env_fn=cartpole_envs(2), policy=server) as collector:
        batches = iter(collector)
        for _ in range(5):
            version = sync.client().push(learner)
            assert next(batches)["policy_version"].unique().tolist() == [version]
