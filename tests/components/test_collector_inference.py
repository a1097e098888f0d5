"""Direct inference, weight sync and the collector over real gymnasium vector envs."""

import pytest
import torch
from tensordict import TensorDict

from components.collectors import Collector, CollectorConfig
from components.envs import VectorEnvStepper, make_vector_env, spec_of
from components.inference import InferenceServer, InferenceServerConfig
from components.weight_sync import WeightSync

from tests.factories import CartPolePolicy, cartpole_envs


def test_inference_stamps_policy_version_and_applies_weight_updates():
    with InferenceServer(policy_factory=CartPolePolicy) as server:
        client = server.client()
        obs = torch.randn(8, 4)
        out = client(TensorDict({"observation": obs}, [8]))
        assert out["action"].shape == (8,) and out["policy_version"].tolist() == [0] * 8
        learner = CartPolePolicy(seed=123)
        assert server.update_weights(learner) == 1
        out = client.submit(TensorDict({"observation": obs}, [8])).result(timeout=5)
        assert out["policy_version"].tolist() == [1] * 8
        assert torch.allclose(out["logits"], learner.net(obs))


def test_weight_sync_versions_reach_the_server_between_calls():
    with WeightSync() as sync, InferenceServer(policy_factory=CartPolePolicy, weight_sync=sync.client()) as server:
        learner = CartPolePolicy(seed=7)
        assert sync.push(learner) == 1
        assert sync.push(learner) == 2
        assert sync.version == 2
        version, state = sync.pull()
        assert version == 2 and torch.equal(state["net.weight"], learner.net.weight)
        obs = torch.randn(3, 4)
        out = server(TensorDict({"observation": obs}, [3]))
        assert out["policy_version"].tolist() == [2, 2, 2] and server.policy_version == 2
        assert torch.allclose(out["logits"], learner.net(obs))


def test_a_late_receiver_gets_the_latest_version():
    with WeightSync() as sync:
        sync.push(CartPolePolicy(seed=3))
        with InferenceServer(policy_factory=CartPolePolicy, weight_sync=sync) as server:
            out = server(TensorDict({"observation": torch.zeros(1, 4)}, [1]))
            assert out["policy_version"].tolist() == [1]


def test_collector_yields_time_by_env_batches_with_specs():
    with InferenceServer(policy_factory=CartPolePolicy) as server:
        with Collector(CollectorConfig(frames_per_batch=64, total_frames=192), create_env_fn=cartpole_envs(4),
                       policy=server.client(), seed=5) as collector:
            batches = list(collector)
    assert len(batches) == 3
    batch = batches[0]
    assert batch.batch_size == torch.Size([16, 4])
    assert batch["observation"].dtype == torch.float32 and batch["observation"].shape == (16, 4, 4)
    assert batch["action"].dtype == torch.long
    for key in ("reward", "terminated", "truncated", "done", "episode_return", "episode_length"):
        assert ("next", key) in batch.keys(include_nested=True)
    assert (batch["next", "done"] == (batch["next", "terminated"] | batch["next", "truncated"])).all()


def test_same_step_autoreset_keeps_final_observation_and_tracks_returns():
    spec = spec_of("CartPole-v1")
    stepper = VectorEnvStepper(make_vector_env("CartPole-v1", 2), seed=0)
    try:
        returns = torch.zeros(2)
        finished = []
        for _ in range(200):
            td = stepper.observation()
            td["action"] = torch.zeros(2, dtype=torch.long)  # always push left: episodes end fast
            td = stepper.step(td)
            returns += td["next", "reward"]
            done = td["next", "done"]
            if done.any():
                # the final observation is out of bounds (terminated), the next observation is a fresh reset
                final = td["next", "observation"][done]
                assert (final[:, 2].abs() > 0.2095).any() or (final[:, 0].abs() > 2.4).any()
                assert (stepper.observation()["observation"][done].abs() <= 0.05).all()
                assert torch.equal(td["next", "episode_return"][done], returns[done])
                finished += returns[done].tolist()
                returns[done] = 0
        assert finished and spec.n_actions == 2 and spec.discrete
    finally:
        stepper.close()


def test_envs_are_seeded_differently_and_reproducibly():
    def first_obs(seed):
        stepper = VectorEnvStepper(make_vector_env("CartPole-v1", 3), seed=seed)
        try:
            return stepper.observation()["observation"].clone()
        finally:
            stepper.close()

    a, b = first_obs(0), first_obs(0)
    assert torch.equal(a, b)
    assert not torch.equal(a[0], a[1])
    assert not torch.equal(first_obs(1), a)


def test_pendulum_spec_is_continuous():
    spec = spec_of("Pendulum-v1")
    assert not spec.discrete and spec.action_shape == (1,) and spec.action_low == (-2.0,)
    assert spec.request_layout(8).describe() == "observation [8, 3] float32"


def _seeded_ppo_policy():
    """PPO's behaviour policy (it samples from the per-env seeds) with the same weights wherever it is built."""
    from recipes.configs import PPOConfig
    from recipes.ppo import make_policy

    with torch.random.fork_rng():
        torch.manual_seed(0)
        return make_policy(PPOConfig(), spec_of("CartPole-v1"))


@pytest.mark.parametrize("placement, transport", [("direct", None), pytest.param("process", "queue", marks=pytest.mark.slow)])
def test_two_env_groups_collect_the_rollouts_of_one_vector_env(placement, transport):
    """Double buffering changes when envs step, not what they see: two groups of 2 envs give the batches one vector
    env of 4 gives (same observations, actions, rewards, episode ends), with the policy in the caller's thread or in
    a server process answering each group's request while the other group steps. (The policy's floats may differ in
    their last bits between a forward over 2 rows and one over 4: log-probabilities are compared to 1e-6.)"""
    with InferenceServer(InferenceServerConfig(placement=placement), policy_factory=_seeded_ppo_policy,
                         transport=transport) as server:
        runs = []
        for envs, groups in ((4, 1), (2, 2)):
            with Collector(CollectorConfig(frames_per_batch=4 * 40, total_frames=4 * 40 * 3, num_collectors=1,
                                           env_groups=groups), create_env_fn=cartpole_envs(envs), policy=server,
                           seed=3) as collector:
                runs.append(torch.cat(list(collector)))
    one, two = runs
    assert one.batch_size == two.batch_size == torch.Size([120, 4])
    assert one["next", "done"].any()  # episodes ended inside the batches: resets are compared too
    for key in one.keys(include_nested=True, leaves_only=True):
        if key == "sample_log_prob":
            torch.testing.assert_close(one.get(key), two.get(key), rtol=0, atol=1e-6)
        else:
            assert torch.equal(one.get(key), two.get(key)), key
