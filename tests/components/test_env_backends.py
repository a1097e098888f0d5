"""Env backends (``env.backend``): gymnasium's per-env vector, CartPole's array-vectorized env and EnvPool, stepped
for real; every one with same-step autoreset, so recipes see the same kind of data on each."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest
import torch

from components.collectors import Collector
from components.env_backends import BACKENDS, EnvPoolVector, SameStepVector

ENVPOOL_SLOW = pytest.mark.slow  # EnvPool's pools start their C++ threads: seconds per test here


def _backends(names):
    return [pytest.param(b, marks=ENVPOOL_SLOW) if b == "envpool" else b for b in names]
from components.envs import NEXT_KEYS, EnvMaker, VectorEnvStepper, next_storage
from components.errors import ConfigurationError

from tests.factories import LocalPolicy

X_LIMIT, THETA_LIMIT = 2.4, 12 * 2 * np.pi / 360  # CartPole's termination thresholds


def roll(maker: EnvMaker, num_envs: int, steps: int, seed: int, policy) -> tuple[dict, np.ndarray]:
    """``steps`` steps of ``num_envs`` envs through the collectors' stepper: the ``next`` arrays ``[time, env]`` and
    the observation carried into each step."""
    stepper = VectorEnvStepper(maker.vector(num_envs), seed)
    try:
        nxt = next_storage(stepper.spec, (steps, num_envs))
        arrays = {key: nxt.get(key).numpy() for key in NEXT_KEYS}
        carried = np.empty((steps, num_envs, 4), dtype=np.float32)
        for t in range(steps):
            carried[t] = stepper.obs
            stepper.step_into(policy(stepper.obs, t), arrays, (t, slice(None)))
    finally:
        stepper.close()
    return arrays, carried


def random_actions(obs, t):
    return np.random.default_rng(t).integers(0, 2, len(obs))


def balancing_actions(obs, t):
    """Pushes the cart toward where the pole falls: keeps it up for hundreds of steps."""
    return (obs[:, 2] + 0.5 * obs[:, 3] > 0).astype(np.int64)


CARTPOLE = [b for b in BACKENDS if b != "ale_vector"]  # ale_vector makes Atari envs only (tests/components/test_pixel_envs.py)


@pytest.mark.parametrize("backend", _backends(CARTPOLE))
def test_every_backend_resets_an_ended_episode_within_its_last_step(backend):
    arrays, carried = roll(EnvMaker(id="CartPole-v1", backend=backend), 8, 400, 3, random_actions)
    done, terminated = arrays["done"], arrays["terminated"]
    assert done.sum() > 50  # random play ends many episodes
    assert (arrays["reward"] == 1).all()  # no step of a reset with its zero reward and ignored action
    final = arrays["observation"][terminated]
    assert ((np.abs(final[:, 0]) > X_LIMIT) | (np.abs(final[:, 2]) > THETA_LIMIT)).all()  # the final observation
    t, e = np.nonzero(done[:-1])
    assert (np.abs(carried[t + 1, e]) <= 0.05).all()  # ... while the next step starts from a fresh reset
    t, e = np.nonzero(~done[:-1])
    np.testing.assert_array_equal(arrays["observation"][t, e], carried[t + 1, e])  # no jump inside an episode
    lengths = arrays["episode_length"]
    assert (lengths[1:][~done[:-1]] == lengths[:-1][~done[:-1]] + 1).all()
    assert (lengths[1:][done[:-1]] == 1).all()


@pytest.mark.parametrize("backend", _backends(CARTPOLE))
def test_every_backend_truncates_at_max_episode_steps(backend):
    arrays, carried = roll(EnvMaker(id="CartPole-v1", kwargs={"max_episode_steps": 20}, backend=backend), 4, 100, 0,
                           balancing_actions)
    assert not arrays["terminated"].any()
    truncated = arrays["truncated"]
    assert (np.flatnonzero(truncated[:, 0]) == [19, 39, 59, 79, 99]).all()
    assert (arrays["episode_length"][truncated] == 20).all() and (arrays["episode_return"][truncated] == 20).all()
    t, e = np.nonzero(truncated[:-1])
    assert not np.isclose(arrays["observation"][t, e], carried[t + 1, e]).all(axis=-1).any()  # final != reset


@pytest.mark.parametrize("backend", _backends(["vector", "envpool"]))
def test_a_fast_backend_is_reproducible_from_its_seed(backend):
    maker = EnvMaker(id="CartPole-v1", backend=backend)
    first, _ = roll(maker, 4, 200, 5, random_actions)
    again, _ = roll(maker, 4, 200, 5, random_actions)
    other, _ = roll(maker, 4, 200, 6, random_actions)
    for key in NEXT_KEYS:
        np.testing.assert_array_equal(first[key], again[key])
    assert not np.array_equal(first["observation"], other["observation"])


@ENVPOOL_SLOW
def test_envpool_steps_continuous_actions_within_their_bounds():
    maker = EnvMaker(id="Pendulum-v1", backend="envpool")
    spec = maker.spec()
    assert not spec.discrete and spec.action_low == (-2.0,) and spec.action_high == (2.0,)
    stepper = VectorEnvStepper(maker.vector(2), 0)
    try:
        nxt = next_storage(stepper.spec, (210, 2))
        arrays = {key: nxt.get(key).numpy() for key in NEXT_KEYS}
        for t in range(210):
            stepper.step_into(np.full((2, 1), 50.0, dtype=np.float32), arrays, (t, slice(None)))  # clipped to 2
    finally:
        stepper.close()
    assert (np.flatnonzero(arrays["truncated"][:, 0]) == [199]).all()
    assert (arrays["reward"] <= 0).all() and (arrays["episode_length"][200] == 1).all()


@pytest.mark.parametrize("backend, cls", [("vector", SameStepVector), ("envpool", EnvPoolVector)])
def test_the_backends_are_what_they_say(backend, cls):
    env = EnvMaker(id="CartPole-v1", backend=backend).vector(2)
    env.close()
    assert isinstance(env, cls)
    assert "backend='envpool'" in repr(EnvMaker(id="CartPole-v1", backend="envpool"))


@pytest.mark.parametrize("kwargs, path, needle", [
    (dict(id="CartPole-v1", backend="fast"), "env.backend", "supported: gymnasium, vector, ale_vector, envpool"),
    (dict(id="Pendulum-v1", backend="vector"), "env.backend", "no array-vectorized implementation"),
    (dict(id="NoSuchEnv-v0", backend="envpool"), "env.id", "EnvPool does not implement 'NoSuchEnv-v0'"),
    (dict(_target_="tests.factories.crashing_envs", backend="envpool"), "env.backend", "makes envs by id"),
])
def test_a_backend_that_cannot_make_the_env_is_refused_naming_why(kwargs, path, needle):
    with pytest.raises(ConfigurationError, match=needle) as info:
        EnvMaker(**kwargs)
    assert info.value.path == path


@pytest.mark.parametrize("backend", _backends(["vector", "envpool"]))
def test_process_collectors_build_fast_backends_where_they_run(backend):
    maker = EnvMaker(id="CartPole-v1", backend=backend)
    with Collector(partial(maker.vector, 4), LocalPolicy(), frames_per_batch=4 * 8 * 2, total_frames=4 * 8 * 2 * 3,
                   num_collectors=2, placement="process",
                   seed=1) as collector:
        batches = list(collector)
    assert [b.batch_size for b in batches] == [torch.Size([8, 8])] * 3
    assert (torch.cat([b["next", "reward"] for b in batches]) == 1).all()
    first = batches[0]["observation"][0]
    assert len({tuple(row.tolist()) for row in first}) == 8  # the two workers' envs differ
