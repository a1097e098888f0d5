"""Observation and reward normalisation owned by the learner: the statistics live in the policy and travel with its
weights, so every worker and every placement normalises with the same figures."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from components.envs import EnvSpec
from components.weight_sync import WeightSync, WeightSyncConfig
from launcher.cli import launch
from recipes.configs import IMPALAConfig, PPOConfig
from recipes.networks import RunningNorm
from recipes.actor_critic import Learner, make_policy
from recipes.ppo import ReturnScale

FRAMES = EnvSpec("ALE/Breakout-v5", (4, 84, 84), torch.uint8, True, 4, (), observation_scale=1 / 255)
PENDULUM = EnvSpec("Pendulum-v1", (3,), torch.float32, False, 0, (1,), (-2.0,), (2.0,))
NORMALISED = PPOConfig(normalize_observations=True, normalize_rewards=True)


def test_running_statistics_are_those_of_everything_seen():
    rng = np.random.default_rng(0)
    batches = [rng.normal(3.0, 2.0, (n, 3)).astype(np.float32) for n in (7, 100, 33)]
    copies = [batch.copy() for batch in batches]
    norm = RunningNorm((3,))
    x = torch.randn(4, 3)
    assert torch.equal(norm(x), x)  # nothing seen yet: the identity
    for batch in batches:
        norm.update(torch.from_numpy(batch))
    assert all(np.array_equal(b, c) for b, c in zip(batches, copies))  # folded in from a copy, not in place
    every = np.concatenate(batches)
    np.testing.assert_allclose(norm.mean.numpy(), every.mean(0), rtol=1e-5)
    np.testing.assert_allclose(norm.var.numpy(), every.var(0), rtol=1e-4)
    assert float(norm.count) == len(every)
    out = norm(torch.from_numpy(every))
    np.testing.assert_allclose(out.mean(0).numpy(), 0, atol=1e-4)
    assert norm(torch.full((1, 3), 1e6)).max() == 10.0  # clipped
    given = torch.from_numpy(every)
    kept = given.clone()
    norm(given)
    assert torch.equal(given, kept)  # normalised in a copy: the caller's observations are not changed
    frames = torch.randint(0, 256, (5, 3), dtype=torch.uint8)  # integer observations: the same figures as floats
    torch.testing.assert_close(norm(frames), norm(frames.float()))


def test_rewards_are_scaled_by_the_spread_of_each_envs_discounted_return():
    scale = ReturnScale(gamma=0.5)
    reward = torch.ones(4, 2)
    done = torch.tensor([[False, False], [False, True], [False, False], [False, False]])
    out = scale(reward, done)
    # discounted returns per env: 1, 1.5, 1.75, 1.875 and 1, 1.5 | 1, 1.5
    seen = np.array([1, 1.5, 1.75, 1.875, 1, 1.5, 1, 1.5])
    np.testing.assert_allclose(out.numpy(), 1 / np.sqrt(seen.var() + 1e-8), rtol=1e-5)
    assert torch.equal(scale.returns, torch.tensor([1.875, 1.5], dtype=torch.float64))  # carried to the next batch


def test_the_statistics_travel_with_the_weights_and_every_receiver_normalises_alike():
    learner = Learner(NORMALISED, PENDULUM)
    learner.policy.actor.norm.update(torch.randn(500, 3) * 4 + 1)
    assert learner.critic[0] is learner.policy.actor.norm  # the critic reads the same statistics
    with WeightSync(WeightSyncConfig(placement="process"), template=make_policy(NORMALISED, PENDULUM),
                    transport="shared_memory") as sync:
        sync.push(learner.policy)
        receivers = [make_policy(NORMALISED, PENDULUM) for _ in range(2)]
        client = sync.client()
        for receiver in receivers:
            assert client.poll(0, receiver) == 1
    obs = torch.randn(8, 3) * 4 + 1
    td = {"observation": obs}
    expected = learner.policy.actor.net(obs)
    for receiver in receivers:
        torch.testing.assert_close(receiver.actor.norm.mean, learner.policy.actor.norm.mean)
        torch.testing.assert_close(receiver.actor.net(obs), expected)
    assert not torch.allclose(make_policy(NORMALISED, PENDULUM).actor.net(td["observation"]), expected)


@pytest.mark.slow  # trains, with collector processes of their own
def test_ppo_trains_with_learner_owned_normalisation_in_worker_processes(compose_cfg, tmp_path):
    from launcher.checkpointing import load

    run_dir = tmp_path / "run"
    launch(compose_cfg("+recipe=ppo", "env=pendulum", "recipe.normalize_observations=true",
                       "recipe.normalize_rewards=true", "service=process", "components.collector.local_policy=true",
                       "components.collector.num_collectors=2", "recipe.num_envs=4", "recipe.num_steps=32",
                       "recipe.total_frames=512", "recipe.num_minibatches=4", "launcher.progress=false",
                       "launcher.checkpoint_every=256"), str(run_dir))
    assert json.loads((run_dir / "summary.json").read_text())["frames"] >= 512
    state = load(str(run_dir / "checkpoint.pt"))["recipe"]
    assert float(state["learner"]["policy.actor.norm.count"]) >= 384  # every batch but the last one learned from
    assert "reward_scale" in state


def test_frames_are_standardised_per_pixel_in_place_of_the_encoders_scaling():
    learner = Learner(IMPALAConfig(normalize_observations=True), FRAMES)
    actor = learner.policy.actor
    convs = torch.nn.Sequential(*list(actor.encoder)[1:])  # the encoder after its Scale
    head = actor.net[1][1]
    frames = torch.randint(0, 256, (6, 4, 84, 84), dtype=torch.uint8)
    frames[:, :, :10] = 87
    # nothing seen yet: the frames are scaled as they would be without normalisation
    torch.testing.assert_close(actor.net(frames), head(convs(frames.float() / 255)))
    seen = torch.randint(0, 256, (64, 4, 84, 84), dtype=torch.uint8)
    seen[:, :, :10] = 87  # a part of the screen that never changes (a wall): no spread, standardised to 0
    actor.norm.update(seen)
    mean, var = seen.double().mean(0), seen.double().var(0, unbiased=False)
    standardised = ((frames.double() - mean) / (var + 1e-8).sqrt()).clamp(-10, 10).float()
    assert standardised[:, :, :10].abs().max() == 0 and standardised.std() > 0.5  # not divided by 255 again
    logits = actor.net(frames)
    torch.testing.assert_close(logits, head(convs(standardised)), rtol=1e-4, atol=1e-4)
    dist, value = learner.dist_and_value(frames)  # the learner's shared trunk reads the same statistics
    torch.testing.assert_close(dist.logits, logits.log_softmax(-1), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(value, learner.value(frames), rtol=1e-4, atol=1e-4)


@pytest.mark.slow  # trains on Atari frames through the launcher
def test_appo_on_atari_learns_with_per_pixel_statistics_it_folds_in_after_each_update(compose_cfg, tmp_path):
    from launcher.checkpointing import load

    run_dir = tmp_path / "run"
    launch(compose_cfg("+recipe=appo", "env=atari", "recipe.num_envs=2", "recipe.unroll_length=8",
                       "recipe.batch_size=2", "recipe.num_minibatches=1", "recipe.total_frames=64",
                       "launcher.progress=false", "launcher.checkpoint_every=16"), str(run_dir))
    state = load(str(run_dir / "checkpoint.pt"))["recipe"]["learner"]
    assert float(state["policy.actor.norm.count"]) == 64  # every frame of the 4 updates, folded in after each
    assert tuple(state["policy.actor.norm.mean"].shape) == (4, 84, 84)
    assert 0 < float(state["policy.actor.norm.var"].max())
